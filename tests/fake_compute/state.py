"""The fake's state: instances, disks, firewalls, operations, injected faults and the request log.

Only what the rig's module and playbooks use is implemented, but what is implemented behaves like
the real API where the module depends on it: full resource URLs in responses, operations that
finish after a delay, errors carried in the operation, requestId de-duplication, fingerprints.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

BASE = "https://www.googleapis.com/compute/v1/"


class ApiError(Exception):
    """An HTTP error the fake answers with, in the API's JSON error shape."""

    def __init__(self, status: int, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.status = status
        self.body = {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
            }
        }


@dataclass
class Faults:
    """Faults to inject. Counters count down as they fire."""

    op_delay: float = 0.0  # seconds before an operation is DONE
    stockout_zones: set[str] = field(default_factory=set)  # inserts there end in a stockout
    quota_sync: str | None = None  # insert answers 403 quotaExceeded naming this metric
    quota_operation: str | None = None  # insert's operation ends in QUOTA_EXCEEDED for this metric
    insert_503: int = 0  # the next N inserts answer 503 before doing anything
    insert_503_after: int = 0  # the next N inserts do the insert, then answer 503 (lost reply)
    status_429: int = 0  # the next N requests of any kind answer 429
    operation_error: dict[str, Any] | None = None  # the next insert's operation ends in this error


def _url(path: str) -> str:
    return BASE + path


def _last(value: str) -> str:
    return value.rstrip("/").rsplit("/", 1)[-1]


class FakeCompute:
    """Thread-safe state of one fake project (any project name is accepted)."""

    def __init__(self, faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        self.lock = threading.RLock()
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.disks: dict[tuple[str, str], dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, tuple[float, Any]] = {}
        self._request_ids: dict[str, str] = {}
        self._ids = itertools.count(1000)
        self.log: list[dict[str, Any]] = []

    # ---- request log helpers for tests -------------------------------------------------------
    def mutating_requests(self) -> list[dict[str, Any]]:
        """Requests that could change state (anything but GET and operation waits)."""
        return [r for r in self.log if r["method"] != "GET" and not r["path"].endswith("/wait")]

    def requests(self, method: str, suffix: str = "") -> list[dict[str, Any]]:
        """Logged requests with this method whose path ends with suffix."""
        return [r for r in self.log if r["method"] == method and r["path"].endswith(suffix)]

    # ---- operations --------------------------------------------------------------------------
    def _operation(self, project: str, zone: str | None, kind: str, target: str, apply: Any) -> dict:
        name = f"operation-{next(self._ids)}"
        scope = f"projects/{project}/zones/{zone}" if zone else f"projects/{project}/global"
        op = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "operationType": kind,
            "status": "RUNNING",
            "progress": 0,
            "targetLink": _url(target),
            "selfLink": _url(f"{scope}/operations/{name}"),
        }
        if zone:
            op["zone"] = _url(f"projects/{project}/zones/{zone}")
        self.operations[name] = op
        self._pending[name] = (time.monotonic() + self.faults.op_delay, apply)
        self.tick()
        return copy.deepcopy(op)

    def tick(self) -> None:
        """Finish every operation whose delay has passed, applying its effect."""
        now = time.monotonic()
        for name, (due, apply) in list(self._pending.items()):
            if due > now:
                continue
            del self._pending[name]
            op = self.operations[name]
            error = apply()
            if error:
                op["error"] = {"errors": [error]}
                op["httpErrorStatusCode"] = error.pop("_http", 400)
                op["httpErrorMessage"] = "SERVICE UNAVAILABLE" if op["httpErrorStatusCode"] == 503 else "ERR"
            op["status"] = "DONE"
            op["progress"] = 100

    def get_operation(self, name: str) -> dict[str, Any]:
        self.tick()
        if name not in self.operations:
            raise ApiError(404, f"The resource 'operations/{name}' was not found", "notFound")
        return copy.deepcopy(self.operations[name])

    def wait_operation(self, name: str, timeout: float = 5.0) -> dict[str, Any]:
        """Like the API's wait: return when DONE or after a while, whichever comes first."""
        end = time.monotonic() + timeout
        while True:
            with self.lock:
                op = self.get_operation(name)
            if op["status"] == "DONE" or time.monotonic() >= end:
                return op
            time.sleep(0.005)

    # ---- instances ---------------------------------------------------------------------------
    def get_instance(self, zone: str, name: str) -> dict[str, Any]:
        self.tick()
        inst = self.instances.get((zone, name))
        if inst is None:
            raise ApiError(404, f"The resource 'zones/{zone}/instances/{name}' was not found", "notFound")
        return copy.deepcopy(inst)

    def list_instances(self, zone: str) -> dict[str, Any]:
        self.tick()
        items = [copy.deepcopy(v) for (z, _), v in sorted(self.instances.items()) if z == zone]
        return {"kind": "compute#instanceList", "items": items}

    def insert_instance(self, project: str, zone: str, body: dict[str, Any], request_id: str | None) -> dict:
        faults = self.faults
        if request_id and request_id in self._request_ids:
            return self.get_operation(self._request_ids[request_id])
        if faults.insert_503:
            faults.insert_503 -= 1
            raise ApiError(503, "The service is currently unavailable.", "backendError")
        if faults.quota_sync:
            metric = faults.quota_sync
            raise ApiError(
                403, f"Quota '{metric}' exceeded.  Limit: 0.0 in region {zone[:-2]}.", "quotaExceeded"
            )
        self._validate_instance(project, zone, body)
        name = body["name"]
        target = f"projects/{project}/zones/{zone}/instances/{name}"

        def apply() -> dict[str, Any] | None:
            if zone in faults.stockout_zones:
                return {
                    "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                    "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough "
                    "resources available to fulfill the request.  '(resource type:compute)'.",
                    "_http": 503,
                }
            if faults.quota_operation:
                metric = faults.quota_operation
                return {
                    "code": "QUOTA_EXCEEDED",
                    "message": f"Quota '{metric}' exceeded.  Limit: 0.0 in region {zone[:-2]}.",
                    "errorDetails": [
                        {
                            "quotaInfo": {
                                "metricName": f"compute.googleapis.com/{metric.lower()}",
                                "limitName": f"{metric}-per-project-region",
                                "dimensions": {"region": zone[:-2]},
                                "limit": 0,
                            }
                        }
                    ],
                    "_http": 403,
                }
            if faults.operation_error:
                error = dict(faults.operation_error)
                faults.operation_error = None
                return error
            self._create_instance(project, zone, body)
            return None

        op = self._operation(project, zone, "insert", target, apply)
        if request_id:
            self._request_ids[request_id] = op["name"]
        if faults.insert_503_after:
            faults.insert_503_after -= 1
            raise ApiError(503, "The service is currently unavailable.", "backendError")
        return op

    def _validate_instance(self, project: str, zone: str, body: dict[str, Any]) -> None:
        if (zone, body.get("name")) in self.instances:
            raise ApiError(409, f"The resource '{body.get('name')}' already exists", "alreadyExists")
        disks = body.get("disks") or []
        if not any(d.get("boot") for d in disks):
            raise ApiError(400, "Invalid value for field 'resource.disks': no boot disk.")
        sched = body.get("scheduling") or {}
        if body.get("guestAccelerators") and sched.get("onHostMaintenance") != "TERMINATE":
            raise ApiError(
                400,
                "Instances with guest accelerators do not support live migration. "
                "Set 'scheduling.onHostMaintenance' to TERMINATE.",
            )
        if sched.get("provisioningModel") == "SPOT" and sched.get("automaticRestart"):
            raise ApiError(400, "Spot VMs do not support automatic restart.")
        for disk in disks:
            if "source" in disk:
                key = (zone, _last(disk["source"]))
                if key not in self.disks:
                    raise ApiError(404, f"The resource '{disk['source']}' was not found", "notFound")
                if self.disks[key]["users"]:
                    raise ApiError(400, f"The disk resource '{disk['source']}' is already being used")
            elif "initializeParams" in disk:
                dname = disk["initializeParams"].get("diskName") or body["name"]
                if (zone, dname) in self.disks:
                    raise ApiError(409, f"The resource 'disks/{dname}' already exists", "alreadyExists")

    def _create_instance(self, project: str, zone: str, body: dict[str, Any]) -> None:
        name = body["name"]
        zone_path = f"projects/{project}/zones/{zone}"
        self_link = _url(f"{zone_path}/instances/{name}")
        disks = []
        for index, disk in enumerate(body.get("disks") or []):
            if "source" in disk:
                dname = _last(disk["source"])
            else:
                params = disk.get("initializeParams") or {}
                dname = params.get("diskName") or name
                self.disks[(zone, dname)] = {
                    "kind": "compute#disk",
                    "name": dname,
                    "sizeGb": str(params.get("diskSizeGb", 10)),
                    "type": _url(f"{zone_path}/diskTypes/{_last(params.get('diskType', 'pd-standard'))}"),
                    "zone": _url(zone_path),
                    "sourceImage": params.get("sourceImage", ""),
                    "status": "READY",
                    "selfLink": _url(f"{zone_path}/disks/{dname}"),
                    "users": [],
                }
            self.disks[(zone, dname)]["users"].append(self_link)
            disks.append(
                {
                    "kind": "compute#attachedDisk",
                    "type": "PERSISTENT",
                    "mode": "READ_WRITE",
                    "index": index,
                    "boot": bool(disk.get("boot")),
                    "autoDelete": bool(disk.get("autoDelete", False)),
                    "deviceName": disk.get("deviceName") or dname,
                    "source": _url(f"{zone_path}/disks/{dname}"),
                    "diskSizeGb": self.disks[(zone, dname)]["sizeGb"],
                }
            )
        n = len(self.instances) + 2
        nics = []
        for nic in body.get("networkInterfaces") or [{}]:
            out = {
                "network": _url(f"projects/{project}/global/networks/{_last(nic.get('network', 'default'))}"),
                "networkIP": f"10.128.0.{n}",
                "name": "nic0",
            }
            if nic.get("subnetwork"):
                out["subnetwork"] = _url(nic["subnetwork"].split("compute/v1/")[-1])
            if nic.get("accessConfigs"):
                out["accessConfigs"] = [
                    dict(ac, natIP=f"203.0.113.{n}", kind="compute#accessConfig")
                    for ac in nic["accessConfigs"]
                ]
            nics.append(out)
        inst = {
            "kind": "compute#instance",
            "id": str(next(self._ids)),
            "name": name,
            "zone": _url(zone_path),
            "machineType": _url(f"{zone_path}/machineTypes/{_last(body['machineType'])}"),
            "status": "RUNNING",
            "disks": disks,
            "networkInterfaces": nics,
            "scheduling": dict(body.get("scheduling") or {}),
            "labels": dict(body.get("labels") or {}),
            "labelFingerprint": "fp0",
            "metadata": {
                "items": list((body.get("metadata") or {}).get("items") or []),
                "fingerprint": "fp0",
            },
            "tags": {"items": list((body.get("tags") or {}).get("items") or []), "fingerprint": "fp0"},
            "selfLink": self_link,
        }
        if body.get("guestAccelerators"):
            inst["guestAccelerators"] = [
                {
                    "acceleratorType": _url(f"{zone_path}/acceleratorTypes/{_last(g['acceleratorType'])}"),
                    "acceleratorCount": g.get("acceleratorCount", 1),
                }
                for g in body["guestAccelerators"]
            ]
        if body.get("serviceAccounts"):
            inst["serviceAccounts"] = body["serviceAccounts"]
        self.instances[(zone, name)] = inst

    def delete_instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        inst = self.get_instance(zone, name)

        def apply() -> None:
            for disk in inst["disks"]:
                key = (zone, _last(disk["source"]))
                if key in self.disks:
                    self.disks[key]["users"] = [u for u in self.disks[key]["users"] if u != inst["selfLink"]]
                    if disk["autoDelete"]:
                        del self.disks[key]
            self.instances.pop((zone, name), None)

        return self._operation(
            project, zone, "delete", f"projects/{project}/zones/{zone}/instances/{name}", apply
        )

    def instance_action(self, project: str, zone: str, name: str, verb: str, body: dict[str, Any]) -> dict:
        inst = self.get_instance(zone, name)
        running = inst["status"] == "RUNNING"
        needs_stop = {"setMachineType", "setMachineResources", "setServiceAccount"}
        if verb in needs_stop and running:
            raise ApiError(400, f"The instance must be stopped for {verb}.", "resourceNotReady")
        if (
            verb == "setScheduling"
            and running
            and (body.get("provisioningModel") != inst["scheduling"].get("provisioningModel"))
        ):
            raise ApiError(400, "The provisioning model can only be changed while stopped.")
        fingerprinted = {
            "setLabels": "labelFingerprint",
            "setMetadata": "fingerprint",
            "setTags": "fingerprint",
        }
        if verb in fingerprinted:
            current = (
                inst["labelFingerprint"] if verb == "setLabels" else inst[verb[3:].lower()]["fingerprint"]
            )
            if body.get(fingerprinted[verb]) != current:
                raise ApiError(
                    412, "Supplied fingerprint does not match current fingerprint.", "conditionNotMet"
                )
        if verb not in needs_stop | set(fingerprinted) | {"start", "stop", "setScheduling"}:
            raise ApiError(400, f"The fake does not implement {verb}.")
        key = (zone, name)

        def apply() -> None:
            live = self.instances[key]
            fp = f"fp{next(self._ids)}"
            if verb == "start":
                live["status"] = "RUNNING"
            elif verb == "stop":
                live["status"] = "TERMINATED"
            elif verb == "setMachineType":
                live["machineType"] = _url(
                    f"projects/{project}/zones/{zone}/machineTypes/{_last(body['machineType'])}"
                )
            elif verb == "setMachineResources":
                live["guestAccelerators"] = body.get("guestAccelerators") or []
            elif verb == "setScheduling":
                live["scheduling"] = dict(body)
            elif verb == "setServiceAccount":
                live["serviceAccounts"] = [{"email": body.get("email"), "scopes": body.get("scopes", [])}]
            elif verb == "setLabels":
                live["labels"] = dict(body.get("labels") or {})
                live["labelFingerprint"] = fp
            elif verb == "setMetadata":
                live["metadata"] = {"items": list(body.get("items") or []), "fingerprint": fp}
            elif verb == "setTags":
                live["tags"] = {"items": list(body.get("items") or []), "fingerprint": fp}

        return self._operation(
            project, zone, verb, f"projects/{project}/zones/{zone}/instances/{name}", apply
        )

    # ---- disks -------------------------------------------------------------------------------
    def add_disk(
        self, project: str, zone: str, name: str, size_gb: int = 250, disk_type: str = "pd-balanced"
    ) -> None:
        """Seed a detached disk, as a previous teardown leaves the data disk."""
        zone_path = f"projects/{project}/zones/{zone}"
        self.disks[(zone, name)] = {
            "kind": "compute#disk",
            "name": name,
            "sizeGb": str(size_gb),
            "type": _url(f"{zone_path}/diskTypes/{disk_type}"),
            "zone": _url(zone_path),
            "status": "READY",
            "selfLink": _url(f"{zone_path}/disks/{name}"),
            "users": [],
        }

    def get_disk(self, zone: str, name: str) -> dict[str, Any]:
        self.tick()
        disk = self.disks.get((zone, name))
        if disk is None:
            raise ApiError(404, f"The resource 'zones/{zone}/disks/{name}' was not found", "notFound")
        out = copy.deepcopy(disk)
        if not out["users"]:
            del out["users"]
        return out

    def delete_disk(self, project: str, zone: str, name: str) -> dict[str, Any]:
        disk = self.get_disk(zone, name)
        if disk.get("users"):
            raise ApiError(400, f"The disk resource '{name}' is already being used by '{disk['users'][0]}'")
        return self._operation(
            project,
            zone,
            "delete",
            f"projects/{project}/zones/{zone}/disks/{name}",
            lambda: self.disks.pop((zone, name), None) and None,
        )

    # ---- firewalls ---------------------------------------------------------------------------
    def get_firewall(self, name: str) -> dict[str, Any]:
        if name not in self.firewalls:
            raise ApiError(404, f"The resource 'global/firewalls/{name}' was not found", "notFound")
        return copy.deepcopy(self.firewalls[name])

    def put_firewall(self, project: str, body: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        fw_name = name or body["name"]
        if name is None and fw_name in self.firewalls:
            raise ApiError(409, f"The resource 'firewalls/{fw_name}' already exists", "alreadyExists")
        if name is not None and name not in self.firewalls:
            raise ApiError(404, f"The resource 'global/firewalls/{name}' was not found", "notFound")

        def apply() -> None:
            merged = dict(self.firewalls.get(fw_name, {}), **body)
            merged["name"] = fw_name
            merged["network"] = _url(
                f"projects/{project}/global/networks/{_last(merged.get('network', 'default'))}"
            )
            merged["selfLink"] = _url(f"projects/{project}/global/firewalls/{fw_name}")
            self.firewalls[fw_name] = merged

        return self._operation(
            project,
            None,
            "insert" if name is None else "patch",
            f"projects/{project}/global/firewalls/{fw_name}",
            apply,
        )

    def delete_firewall(self, project: str, name: str) -> dict[str, Any]:
        self.get_firewall(name)
        return self._operation(
            project,
            None,
            "delete",
            f"projects/{project}/global/firewalls/{name}",
            lambda: self.firewalls.pop(name, None) and None,
        )
