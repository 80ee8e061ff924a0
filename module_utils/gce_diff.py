"""Compare an existing instance with what the module was asked for, and say how each change applies.

Only what the caller asked for is compared (docs/gce.md, "What the API fills in"). The API fills in
server-side fields on every VM (the NIC's subnetwork even on the ``default`` network, networkIP,
fingerprints, disk URLs and interfaces, scheduling defaults, cpuPlatform...); those are never
compared, an option left unset is never a difference, and keys or labels someone else added
(the console, the guest environment, Google's own ``goog-`` labels) are kept, not removed.

Each compared field falls in one class: ``in_place`` (labels, metadata, tags: applied while
running), ``stop`` (machine type, GPU, scheduling, service account: need the VM stopped), or
``recreate`` (network, subnetwork, external IP, data disk: this module does not recreate a VM).
"""

from __future__ import annotations

from typing import Any

from ansible.module_utils.gce_body import metadata_items, scheduling

IN_PLACE = ("labels", "metadata", "tags")
NEEDS_STOP = ("machine_type", "accelerator_type", "accelerator_count", "scheduling", "service_account")
RECREATE = ("network", "subnetwork", "external_ip", "data_disk")
# The project's Compute Engine default service account is PROJECT_NUMBER-compute@developer...; the
# API stores that email when the caller asks for "default".
DEFAULT_SA_SUFFIX = "-compute@developer.gserviceaccount.com"
SSH_KEYS = "ssh-keys"
_SCHED_KEYS = ("onHostMaintenance", "automaticRestart", "provisioningModel", "instanceTerminationAction")


def _last(value: str | None) -> str:
    return (value or "").rstrip("/").rsplit("/", 1)[-1]


def _scheduling_as_stored(sched: dict[str, Any]) -> dict[str, Any]:
    """Scheduling with the API's documented defaults written out, when a reply leaves them out.

    Standard VMs default to MIGRATE and automatic restart; spot and preemptible VMs can only
    TERMINATE and never restart automatically; the provisioning model defaults to STANDARD.
    """
    out = {k: v for k, v in sched.items() if k in _SCHED_KEYS}
    spot = out.get("provisioningModel") == "SPOT" or bool(sched.get("preemptible"))
    out.setdefault("provisioningModel", "SPOT" if out.get("provisioningModel") == "SPOT" else "STANDARD")
    out.setdefault("onHostMaintenance", "TERMINATE" if spot else "MIGRATE")
    out.setdefault("automaticRestart", not spot)
    return out


def summarize_existing(inst: dict[str, Any]) -> dict[str, Any]:
    """The comparable fields of an instance as the API returns it (REST JSON)."""
    gpus = inst.get("guestAccelerators") or []
    nic = (inst.get("networkInterfaces") or [{}])[0]
    accounts = inst.get("serviceAccounts") or []
    return {
        "machine_type": _last(inst.get("machineType")),
        "accelerator_type": _last(gpus[0].get("acceleratorType")) if gpus else "",
        "accelerator_count": int(gpus[0].get("acceleratorCount", 0)) if gpus else 0,
        "scheduling": _scheduling_as_stored(inst.get("scheduling") or {}),
        "service_account": {
            "email": accounts[0].get("email", "") if accounts else "",
            "scopes": sorted(accounts[0].get("scopes") or []) if accounts else [],
        },
        "labels": dict(inst.get("labels") or {}),
        "metadata": {i["key"]: i.get("value", "") for i in (inst.get("metadata") or {}).get("items") or []},
        "tags": sorted((inst.get("tags") or {}).get("items") or []),
        "network": _last(nic.get("network")),
        "subnetwork": _last(nic.get("subnetwork")),
        "external_ip": bool(nic.get("accessConfigs")),
        # Persistent non-boot disks by name (a local SSD has no source and is not the data disk).
        "data_disk": sorted(
            _last(d.get("source")) for d in inst.get("disks") or [] if not d.get("boot") and d.get("source")
        ),
    }


def summarize_wanted(params: dict[str, Any]) -> dict[str, Any]:
    """The fields the parameters ask for; a field the caller left unset is absent."""
    gpu = (params.get("accelerator_count") or 0) > 0
    spec = params.get("data_disk") or {}
    wanted: dict[str, Any] = {
        "machine_type": params["machine_type"],
        "accelerator_count": params.get("accelerator_count") or 0,
        "scheduling": scheduling(params),
        "labels": {str(k): str(v) for k, v in (params.get("labels") or {}).items()},
        "metadata": metadata_items(params),
        "network": params["network"],
        "external_ip": bool(params.get("external_ip", True)),
    }
    if gpu:
        wanted["accelerator_type"] = params["accelerator_type"]
    if params.get("service_account"):
        wanted["service_account"] = {
            "email": params["service_account"],
            "scopes": sorted(params.get("scopes") or []),
        }
    if params.get("tags") is not None:
        wanted["tags"] = sorted(params["tags"])
    if params.get("subnetwork"):
        wanted["subnetwork"] = params["subnetwork"]
    if spec.get("enabled", True):
        wanted["data_disk"] = [spec.get("name") or f"{params['name']}-data"]
    return wanted


def _ssh_lines(value: str) -> list[str]:
    return [line for line in (value or "").splitlines() if line.strip()]


def _email_matches(have: str, want: str) -> bool:
    if want == "default":
        return have == "default" or have.endswith(DEFAULT_SA_SUFFIX)
    return have == want


def merged(field: str, have: Any, want: Any) -> Any:
    """The value a field should hold after the run: the wanted one, keeping what others added.

    Labels and metadata keep keys the caller did not name; ``ssh-keys`` keeps lines others added
    (the console's and ``gcloud compute ssh``'s keys) and appends the wanted ones that are missing.
    """
    if field == "labels":
        return dict(have, **want)
    if field == "metadata":
        out = dict(have)
        for key, value in want.items():
            if key == SSH_KEYS and key in have:
                lines = _ssh_lines(have[key])
                out[key] = "\n".join(lines + [line for line in _ssh_lines(value) if line not in lines])
            else:
                out[key] = value
        return out
    if field == "scheduling":
        return dict(want)
    return want


def differs(field: str, have: Any, want: Any) -> bool:
    """True when the VM does not hold what the caller asked for in ``field``."""
    if field == "labels":
        return any(have.get(k) != v for k, v in want.items())
    if field == "metadata":
        return merged(field, have, want) != have
    if field == "scheduling":
        return any(have.get(k) != v for k, v in want.items())
    if field == "service_account":
        return not _email_matches(have["email"], want["email"]) or set(have["scopes"]) != set(want["scopes"])
    if field == "data_disk":
        return not set(want) <= set(have)
    return have != want


def changes(before: dict[str, Any], wanted: dict[str, Any]) -> dict[str, list[str]]:
    """Changed field names grouped by how they can be applied."""
    changed = [k for k in wanted if differs(k, before[k], wanted[k])]
    return {
        "in_place": [k for k in changed if k in IN_PLACE],
        "stop": [k for k in changed if k in NEEDS_STOP],
        "recreate": [k for k in changed if k in RECREATE],
    }


def diff_views(before: dict[str, Any], wanted: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Before and after for Ansible's diff: only the compared fields, after = what the run leaves."""
    old = {k: before[k] for k in wanted}
    new = {
        k: merged(k, before[k], wanted[k]) if differs(k, before[k], wanted[k]) else before[k] for k in wanted
    }
    return old, new
