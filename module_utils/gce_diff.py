"""Compare an existing instance with the wanted one, field by field, and say how each change applies.

Each compared field falls in one class: ``in_place`` (labels, metadata, tags: applied while
running), ``stop`` (machine type, GPU, scheduling, service account: need the VM stopped), or
``recreate`` (network, external IP, data disk: this module does not recreate a VM; it fails).
"""

from __future__ import annotations

from typing import Any

from ansible.module_utils.gce_body import metadata_items, scheduling

IN_PLACE = ("labels", "metadata", "tags")
NEEDS_STOP = ("machine_type", "accelerator_type", "accelerator_count", "scheduling", "service_account")
RECREATE = ("network", "subnetwork", "external_ip", "data_disk")


def _last(value: str | None) -> str:
    return (value or "").rstrip("/").rsplit("/", 1)[-1]


def summarize_existing(inst: dict[str, Any]) -> dict[str, Any]:
    """The compared fields of an instance as the API returns it (REST JSON)."""
    gpus = inst.get("guestAccelerators") or []
    nic = (inst.get("networkInterfaces") or [{}])[0]
    sched = {k: v for k, v in (inst.get("scheduling") or {}).items() if k in _SCHED_KEYS}
    sched.setdefault("provisioningModel", "STANDARD")
    accounts = inst.get("serviceAccounts") or []
    return {
        "machine_type": _last(inst.get("machineType")),
        "accelerator_type": _last(gpus[0].get("acceleratorType")) if gpus else "",
        "accelerator_count": int(gpus[0].get("acceleratorCount", 0)) if gpus else 0,
        "scheduling": sched,
        "service_account": accounts[0].get("email", "") if accounts else "",
        "labels": dict(inst.get("labels") or {}),
        "metadata": {i["key"]: i.get("value", "") for i in (inst.get("metadata") or {}).get("items") or []},
        "tags": sorted((inst.get("tags") or {}).get("items") or []),
        "network": _last(nic.get("network")),
        "subnetwork": _last(nic.get("subnetwork")),
        "external_ip": bool(nic.get("accessConfigs")),
        "data_disk": sorted(_last(d.get("source")) for d in inst.get("disks") or [] if not d.get("boot")),
    }


_SCHED_KEYS = ("onHostMaintenance", "automaticRestart", "provisioningModel", "instanceTerminationAction")


def summarize_wanted(params: dict[str, Any]) -> dict[str, Any]:
    """The same fields for what the module parameters ask for."""
    gpu = (params.get("accelerator_count") or 0) > 0
    spec = params.get("data_disk") or {}
    data = [spec.get("name") or f"{params['name']}-data"] if spec.get("enabled", True) else []
    return {
        "machine_type": params["machine_type"],
        "accelerator_type": params["accelerator_type"] if gpu else "",
        "accelerator_count": params.get("accelerator_count") or 0,
        "scheduling": scheduling(params),
        "service_account": params.get("service_account") or "",
        "labels": dict(params.get("labels") or {}),
        "metadata": metadata_items(params),
        "tags": sorted(params.get("tags") or []),
        "network": params["network"],
        "subnetwork": params.get("subnetwork") or "",
        "external_ip": bool(params.get("external_ip", True)),
        "data_disk": data,
    }


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[str]]:
    """Changed field names grouped by how they can be applied."""
    changed = [k for k in after if before.get(k) != after[k]]
    # A service account that was never asked for is left alone rather than removed.
    if not after["service_account"] and "service_account" in changed:
        changed.remove("service_account")
    return {
        "in_place": [k for k in changed if k in IN_PLACE],
        "stop": [k for k in changed if k in NEEDS_STOP],
        "recreate": [k for k in changed if k in RECREATE],
    }
