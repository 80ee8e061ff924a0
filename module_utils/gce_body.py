"""Build the instance resource (REST JSON, camelCase) the module inserts, from module parameters."""

from __future__ import annotations

from typing import Any

STOPPED = "TERMINATED"


def region_of(zone: str) -> str:
    """us-central1-a -> us-central1."""
    return zone.rsplit("-", 1)[0]


def metadata_items(params: dict[str, Any]) -> dict[str, str]:
    """Instance metadata as one dict: free-form items plus the named conveniences."""
    items = {str(k): str(v) for k, v in (params.get("metadata") or {}).items()}
    if params.get("startup_script"):
        items["startup-script"] = params["startup_script"]
    if params.get("ssh_keys"):
        items["ssh-keys"] = "\n".join(params["ssh_keys"])
    if params.get("os_login") is not None:
        items["enable-oslogin"] = "TRUE" if params["os_login"] else "FALSE"
    if params.get("known_hosts"):
        # The guest environment publishes the VM's SSH host keys (guest attributes, hostkeys/) only
        # when this is TRUE; they are how the controller learns them over a trusted channel.
        items["enable-guest-attributes"] = "TRUE"
    return items


def scheduling(params: dict[str, Any]) -> dict[str, Any]:
    """GPU VMs cannot live-migrate (TERMINATE); spot VMs cannot restart automatically."""
    gpu = (params.get("accelerator_count") or 0) > 0
    spot = params.get("provisioning_model") == "spot"
    out: dict[str, Any] = {
        "onHostMaintenance": "TERMINATE" if gpu or spot else "MIGRATE",
        "automaticRestart": not spot,
        "provisioningModel": "SPOT" if spot else "STANDARD",
    }
    if spot:
        out["instanceTerminationAction"] = params.get("termination_action", "stop").upper()
    return out


def data_disk(params: dict[str, Any], zone: str, existing: dict[str, Any] | None) -> dict[str, Any] | None:
    """The data disk: attach the existing one by name, else create it inline (so a failed insert leaves none)."""
    spec = params.get("data_disk") or {}
    if not spec.get("enabled", True):
        return None
    name = spec.get("name") or f"{params['name']}-data"
    out: dict[str, Any] = {
        "boot": False,
        "autoDelete": bool(spec.get("auto_delete", False)),
        # Fixed whatever the disk is called: the rig finds it as /dev/disk/by-id/google-<instance>-data
        # (inventory/group_vars/gce.yml).
        "deviceName": f"{params['name']}-data",
    }
    if existing:
        out["source"] = f"projects/{params['project']}/zones/{zone}/disks/{name}"
    else:
        out["initializeParams"] = {
            "diskName": name,
            "diskSizeGb": str(spec.get("size_gb", 250)),
            "diskType": f"zones/{zone}/diskTypes/{spec.get('type', 'pd-balanced')}",
        }
    return out


def instance_body(
    params: dict[str, Any], zone: str, existing_data_disk: dict[str, Any] | None
) -> dict[str, Any]:
    """The full insert body for ``zone``."""
    name = params["name"]
    boot = params.get("boot_disk") or {}
    image = params.get("image") or {}
    source_image = (
        f"projects/{image.get('project', 'debian-cloud')}/global/images/family/{image['family']}"
        if image.get("family")
        else f"projects/{image.get('project', 'debian-cloud')}/global/images/{image['name']}"
    )
    disks = [
        {
            "boot": True,
            "autoDelete": bool(boot.get("auto_delete", True)),  # the API's default is false: say it
            "deviceName": name,
            "initializeParams": {
                "diskName": name,
                "sourceImage": source_image,
                "diskSizeGb": str(boot.get("size_gb", 32)),
                "diskType": f"zones/{zone}/diskTypes/{boot.get('type', 'pd-ssd')}",
            },
        }
    ]
    data = data_disk(params, zone, existing_data_disk)
    if data:
        disks.append(data)
    nic: dict[str, Any] = {"network": f"projects/{params['project']}/global/networks/{params['network']}"}
    if params.get("subnetwork"):
        nic["subnetwork"] = (
            f"projects/{params['project']}/regions/{region_of(zone)}/subnetworks/{params['subnetwork']}"
        )
    if params.get("external_ip", True):
        nic["accessConfigs"] = [{"name": "External NAT", "type": "ONE_TO_ONE_NAT", "networkTier": "PREMIUM"}]
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{zone}/machineTypes/{params['machine_type']}",
        "disks": disks,
        "networkInterfaces": [nic],
        "scheduling": scheduling(params),
        "labels": {str(k): str(v) for k, v in (params.get("labels") or {}).items()},
        "metadata": {"items": [{"key": k, "value": v} for k, v in sorted(metadata_items(params).items())]},
        "tags": {"items": sorted(params.get("tags") or [])},
    }
    if params.get("accelerator_count"):
        body["guestAccelerators"] = [
            {
                "acceleratorType": f"projects/{params['project']}/zones/{zone}/acceleratorTypes/{params['accelerator_type']}",
                "acceleratorCount": params["accelerator_count"],
            }
        ]
    if params.get("service_account"):
        body["serviceAccounts"] = [
            {"email": params["service_account"], "scopes": list(params.get("scopes") or [])}
        ]
    return body
