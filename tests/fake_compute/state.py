"""The fake's state: instances, disks, firewalls, operations, injected faults and the request log.

Only what the rig's modules use is implemented, but what is implemented follows the Compute Engine
API reference (instances, disks, zoneOperations) rather than what our module happens to send:

- Strict on input: unknown fields are refused as the real API refuses them (the body is parsed
  with the released client's message types), and so are bad enum values, names, sizes, machine
  types, GPU counts a machine type cannot take, a GPU VM that would live-migrate, a spot VM that
  restarts itself, a non-UUID requestId.
- Filled in on output: every VM gets what the real API adds whether or not the caller sent it:
  the NIC's subnetwork (the region's ``default`` subnetwork on the auto-mode ``default`` network),
  networkIP, NIC name, kind, fingerprint and stackType; the disks' source URL, deviceName
  (``persistent-disk-N`` when none was asked), index, type, mode, interface, licenses,
  guestOsFeatures, diskSizeGb and architecture; full scheduling defaults (automaticRestart,
  onHostMaintenance, preemptible, provisioningModel); cpuPlatform, status, selfLink, kind, id,
  creationTimestamp, lastStartTimestamp, fingerprints for the instance, labels, metadata, tags and
  NICs, shielded-VM defaults, and the project's default service account email for ``default``.
  A firewall rule gets kind, id, creationTimestamp, selfLink, its network's URL, priority 1000,
  direction INGRESS, ``logConfig: {enable: false}`` and ``disabled: false``; a patch merges into it
  (JSON merge patch) and an update (PUT) replaces it whole, as the Firewall reference says.
- Operations go PENDING -> RUNNING -> DONE after a delay, carry clientOperationId, insertTime,
  startTime, endTime, user and progress, and carry errors the way the API does. The VM passes
  through PROVISIONING/STAGING, STOPPING and TERMINATED while they run.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from tests.fake_compute import catalog

BASE = "https://www.googleapis.com/compute/v1/"
PROJECT_NUMBER = "123456789012"
DEFAULT_SA = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC1035, 1-63 characters
_METADATA_KEY = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
ON_HOST_MAINTENANCE = {"MIGRATE", "TERMINATE"}
PROVISIONING_MODELS = {"STANDARD", "SPOT", "FLEX_START", "RESERVATION_BOUND"}
TERMINATION_ACTIONS = {"STOP", "DELETE"}
NETWORK_TIERS = {"PREMIUM", "STANDARD"}
DISK_MODES = {"READ_WRITE", "READ_ONLY"}
DISK_INTERFACES = {"SCSI", "NVME"}
STOPPED = "TERMINATED"
# zoneOperations.list's filter, the one form the fake parses: `targetId = "N"` (AIP-160).
_OPS_FILTER = re.compile(r'targetId = "([0-9]{1,20})"')


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


class DropConnection(Exception):
    """The server did the work, then the connection dropped before any reply was written."""


@dataclass
class Faults:
    """Faults to inject. Counters count down as they fire."""

    op_delay: float = 0.0  # seconds before an operation is DONE
    stockout_zones: set[str] = field(default_factory=set)  # inserts and starts there end in a stockout
    quota_sync: str | None = None  # insert answers 403 quotaExceeded naming this metric
    quota_operation: str | None = None  # insert's operation ends in QUOTA_EXCEEDED for this metric
    insert_503: int = 0  # the next N inserts answer 503 before doing anything
    insert_503_after: int = 0  # the next N inserts do the insert, then answer 503 (lost reply)
    insert_drop_after: int = 0  # the next N inserts do the insert, then drop the connection
    status_429: int = 0  # the next N requests of any kind answer 429
    status_429_suffix: str = ""  # ... only those whose path ends with this
    operation_error: dict[str, Any] | None = None  # the next insert's operation ends in this error
    ops_hang: bool = False  # operations started from now on never finish
    wait_max: float = 5.0  # operations.wait returns after this long at most (the API: ~2 minutes)
    hostkeys_delay: float = 0.0  # seconds after a VM is seen RUNNING before its guest publishes host keys


class Backing(Protocol):
    """What really runs behind a fake instance (a podman container, a test's fake rig).

    The instance's settled status follows ``running()``; a start or stop that succeeds calls
    ``start()`` or ``stop()`` when its operation completes.
    """

    def running(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


def _url(path: str) -> str:
    return BASE + path


def _last(value: str) -> str:
    return value.rstrip("/").rsplit("/", 1)[-1]


# The API writes every instance, disk, firewall and operation timestamp in US Pacific time with
# its offset and milliseconds, never UTC with a Z: the reference calls them "RFC3339 text format"
# (Instance.lastStartTimestamp, https://pub.dev/documentation/googleapis/latest/compute_v1/Instance/lastStartTimestamp.html),
# and an instance read back from the real API (a us-west1 VM in a public gcloud dump) carries
# "creationTimestamp": "2022-02-20T14:06:38.887-08:00", "lastStartTimestamp":
# "2022-02-27T19:38:56.037-08:00" and "lastStopTimestamp": "2022-02-27T19:38:11.490-08:00".
PACIFIC = ZoneInfo("America/Los_Angeles")


def stamp(moment: datetime) -> str:
    """``moment`` as the API writes a timestamp: Pacific time, milliseconds, the offset."""
    return moment.astimezone(PACIFIC).isoformat(timespec="milliseconds")


def fingerprint(value: Any) -> str:
    """An opaque 8-byte fingerprint of a value, base64 like the API's (e.g. ``42WmSpB8rSM=``)."""
    digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()
    return base64.b64encode(digest[:8]).decode()


# The API's own messages, as it answers them (each quoted where it was published):
# - notFound (404), with the resource's full path: "The resource
#   'projects/P/zones/us-central1-a/instanceGroupManagers/N' was not found", the whole JSON body in
#   https://github.com/GoogleCloudPlatform/magic-modules/pull/4377, an instance's in
#   https://github.com/cloud-barista/cb-spider/issues/340.
# - alreadyExists (409): "The resource 'projects/P/global/firewalls/N' already exists",
#   https://github.com/mesosphere-backup/terraform-dcos/issues/23.
# - QUOTA_EXCEEDED / quotaExceeded: "Quota 'C2_CPUS' exceeded.  Limit: 50.0 in region us-east1."
#   (two spaces, as sent), https://github.com/scylladb/scylla-cluster-tests/issues/3649.
# - ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS, an operation error answered 503 SERVICE UNAVAILABLE:
#   "The zone 'projects/P/zones/us-east1-c' does not have enough resources available to fulfill the
#   request.  '(resource type:compute)'.", https://github.com/scylladb/scylla-cluster-tests/issues/12477;
#   its errorDetails (help link, localizedMessage, errorInfo resource_availability) as in
#   https://github.com/kubernetes/k8s.io/issues/9834.
# No public source was found for these, which keep the fake's own wording: the 503 backendError
# "The service is currently unavailable.", the 429 rateLimitExceeded "Rate Limit Exceeded", the
# 412 conditionNotMet fingerprint message, and the 400 "invalid" messages of the validation below.
def _not_found(path: str) -> ApiError:
    return ApiError(404, f"The resource '{path}' was not found", "notFound")


def _scope(project: str | None, path: str) -> str:
    """A resource's path as the API names it in messages: from projects/ on, when the project is known."""
    return f"projects/{project}/{path}" if project else path


def _invalid(field_path: str, value: Any, why: str) -> ApiError:
    return ApiError(400, f"Invalid value for field '{field_path}': '{value}'. {why}")


def _parse(message_name: str, body: dict[str, Any], where: str) -> None:
    """Refuse unknown fields the way the API does, using the released client's message types.

    The API's words for an unknown field, from the field's path on: ``Invalid JSON payload received.
    Unknown name "fieldList_" at 'insertion_order': Cannot find field.`` (the JSON body in
    https://github.com/google-marketing-solutions/dv360-api-appsscript-samples/issues/7), the path
    going down into nested objects and lists (``at 'tools[0].function_declarations[0].parameters'``,
    https://github.com/mnfst/llm-gateway/issues/1858). How Compute Engine spells the path inside its
    own bodies is not published: wording not verified beyond that shape.
    """
    from google.cloud import compute_v1

    try:
        getattr(compute_v1, message_name).from_json(json.dumps(body), ignore_unknown_fields=False)
    except Exception as exc:  # json_format.ParseError: name the unknown field as the API would
        match = re.search(r'no field named "([^"]+)" at "([^"]+)"', str(exc))
        if match:
            inner = match.group(2).partition(".")[2]  # "Firewall.allowed[0]": below the body
            path = f"{where}.{inner}" if inner else where
            raise ApiError(
                400,
                f"Invalid JSON payload received. Unknown name \"{match.group(1)}\" at '{path}': "
                "Cannot find field.",
            ) from exc
        # A value of the wrong type: the prefix is the API's (above), the rest is protobuf's own
        # words (wording not verified).
        raise ApiError(400, f"Invalid JSON payload received. {str(exc).splitlines()[0]}") from exc


def _uint64_id() -> str:
    """A resource id as the API writes one: a uint64 in decimal, in a string (unique across fakes too)."""
    return str(10**18 + uuid.uuid4().int % (9 * 10**18))


class FakeCompute:
    """Thread-safe state of one fake project (any project name is accepted)."""

    def __init__(self, faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        # What time the API thinks it is: a test fixes it to check figures read from timestamps.
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self.lock = threading.RLock()
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.disks: dict[tuple[str, str], dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        # network name -> None for auto mode (a subnetwork named like the network in every region),
        # or the set of "region/subnetwork" names of a custom-mode network.
        self.networks: dict[str, set[str] | None] = {"default": None}
        self._pending: dict[str, tuple[float, Any]] = {}
        self._request_ids: dict[str, str] = {}
        self._ids = itertools.count(1000)
        self._ips = itertools.count(2)
        self.log: list[dict[str, Any]] = []
        # Answers the fake refused to send because the real API's types do not have them (strict.py).
        self.mismatches: list[str] = []

        # instance id -> {key type: base64 blob}: what the guest environment publishes under
        # hostkeys/ (tests may replace a value to play a guest whose keys changed, or a hostile one).
        self.host_keys: dict[str, dict[str, str]] = {}
        self._booted: dict[str, float] = {}
        # (zone, name) -> what runs behind that instance (seed_instance); absent: the fake's state only.
        self.backings: dict[tuple[str, str], Backing] = {}

    def now(self) -> str:
        return stamp(self.clock())

    # ---- request log helpers for tests -------------------------------------------------------
    def mutating_requests(self) -> list[dict[str, Any]]:
        """Requests that could change state (anything but GET and operation waits)."""
        # Resource Manager's getIamPolicy is a POST that changes nothing.
        return [
            r for r in self.log if r["method"] != "GET" and not r["path"].endswith(("/wait", ":getIamPolicy"))
        ]

    def requests(self, method: str, suffix: str = "") -> list[dict[str, Any]]:
        """Logged requests with this method whose path ends with suffix."""
        return [r for r in self.log if r["method"] == method and r["path"].endswith(suffix)]

    # ---- requestId ---------------------------------------------------------------------------
    def replayed(self, request_id: str | None) -> dict[str, Any] | None:
        """The operation a repeated requestId already started (the API answers it again), else None."""
        if request_id is None:
            return None
        try:
            valid = uuid.UUID(request_id).int != 0
        except ValueError:
            valid = False
        if not valid:
            raise _invalid("requestId", request_id, "The request ID must be a valid non-zero UUID.")
        if request_id in self._request_ids:
            return self.get_operation(self._request_ids[request_id])
        return None

    def remember(self, request_id: str | None, op: dict[str, Any]) -> None:
        if request_id and op.get("kind") == "compute#operation":
            self._request_ids[request_id] = op["name"]
            self.operations[op["name"]]["clientOperationId"] = request_id
            op["clientOperationId"] = request_id

    # ---- operations --------------------------------------------------------------------------
    def _operation(
        self, project: str, zone: str | None, kind: str, target: str, apply: Any, target_id: str | None = None
    ) -> dict:
        name = f"operation-{int(time.time() * 1000)}-{next(self._ids)}"
        scope = f"projects/{project}/zones/{zone}" if zone else f"projects/{project}/global"
        now = self.now()
        op = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "operationType": kind,
            "status": "RUNNING",
            "progress": 0,
            "targetLink": _url(target),
            # The target's own id where it exists already (the API's: an instance's operations
            # are found by it, zoneOperations.list's filter); a new resource's is made up.
            "targetId": target_id or str(next(self._ids)),
            "user": "fake-caller@example.com",
            "insertTime": now,
            "startTime": now,
            "selfLink": _url(f"{scope}/operations/{name}"),
        }
        if zone:
            op["zone"] = _url(f"projects/{project}/zones/{zone}")
        self.operations[name] = op
        due = float("inf") if self.faults.ops_hang else time.monotonic() + self.faults.op_delay
        self._pending[name] = (due, apply)
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
                op["httpErrorMessage"] = {
                    503: "SERVICE UNAVAILABLE",
                    403: "FORBIDDEN",
                    500: "INTERNAL SERVER ERROR",
                }.get(op["httpErrorStatusCode"], "BAD REQUEST")
            op["status"] = "DONE"
            op["progress"] = 100
            op["endTime"] = self.now()

    def get_operation(self, name: str, scope: str = "") -> dict[str, Any]:
        """An operation; ``scope`` (projects/P/zones/Z or projects/P/global) names it in a 404."""
        self.tick()
        if name not in self.operations:
            raise _not_found(f"{scope}/operations/{name}" if scope else f"operations/{name}")
        return copy.deepcopy(self.operations[name])

    def wait_operation(self, name: str, scope: str = "") -> dict[str, Any]:
        """Like the API's wait: return when DONE or after a while, whichever comes first."""
        end = time.monotonic() + self.faults.wait_max
        while True:
            with self.lock:
                op = self.get_operation(name, scope)
            if op["status"] == "DONE" or time.monotonic() >= end:
                return op
            time.sleep(0.005)

    # ---- instances ---------------------------------------------------------------------------
    def get_instance(self, zone: str, name: str, project: str | None = None) -> dict[str, Any]:
        self.tick()
        inst = self.instances.get((zone, name))
        if inst is None:
            raise _not_found(_scope(project, f"zones/{zone}/instances/{name}"))
        self._observe(zone, name)
        return copy.deepcopy(inst)

    def _observe(self, zone: str, name: str) -> None:
        """A settled backed instance follows what runs; one that stopped by itself was its guest's poweroff."""
        inst = self.instances[(zone, name)]
        backing = self.backings.get((zone, name))
        if backing is None or inst["status"] not in ("RUNNING", STOPPED):
            return
        running = backing.running()
        if inst["status"] == "RUNNING" and not running:
            self._stopped_by(zone, name, "compute.instances.guestTerminate")
        elif running:
            inst["status"] = "RUNNING"

    def _stopped_by(self, zone: str, name: str, kind: str) -> None:
        """The instance is TERMINATED by something other than an API call: the zone operation the API records."""
        inst = self.instances[(zone, name)]
        inst["status"] = STOPPED
        inst["lastStopTimestamp"] = self.now()
        project = _last(inst["zone"].rsplit("/zones/", 1)[0])
        now = self.now()
        op_name = f"systemevent-{int(time.time() * 1000)}-{next(self._ids)}"
        scope = f"projects/{project}/zones/{zone}"
        self.operations[op_name] = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": op_name,
            "operationType": kind,
            "status": "DONE",
            "progress": 100,
            "targetLink": inst["selfLink"],
            "targetId": inst["id"],
            "user": "system",
            "insertTime": now,
            "startTime": now,
            "endTime": now,
            "selfLink": _url(f"{scope}/operations/{op_name}"),
            "zone": _url(scope),
        }

    def preempt(self, zone: str, name: str) -> dict[str, Any]:
        """Compute Engine preempts a spot VM: what runs behind it stops, it is TERMINATED, and the zone
        records a ``compute.instances.preempted`` operation by ``system``. Only a RUNNING one can be."""
        refusal = "The fake preempts RUNNING instances only; {name} is {status}."
        return self._terminate(zone, name, "compute.instances.preempted", refusal)

    def guest_terminate(self, zone: str, name: str) -> dict[str, Any]:
        """The guest powers off (idle stop does): ``compute.instances.guestTerminate``."""
        refusal = "Only a RUNNING instance's guest can power off; {name} is {status}."
        return self._terminate(zone, name, "compute.instances.guestTerminate", refusal)

    def _terminate(self, zone: str, name: str, operation_type: str, refusal: str) -> dict[str, Any]:
        """A RUNNING instance stops outside the API's own stop: its backing stops, the zone records
        ``operation_type``; anything else is refused with ``refusal`` (formatted with name, status)."""
        inst = self.get_instance(zone, name)
        if inst["status"] != "RUNNING":
            raise ApiError(400, refusal.format(name=name, status=inst["status"]))
        backing = self.backings.get((zone, name))
        if backing is not None:
            backing.stop()
        self._stopped_by(zone, name, operation_type)
        return self.get_instance(zone, name)

    def list_operations(self, project: str, zone: str, query: dict[str, str]) -> dict[str, Any]:
        """zoneOperations.list with the one filter form the fake knows (``targetId = "N"``, AIP-160);
        any other filter, or a paging parameter, is refused as the API refuses what it cannot parse."""
        unknown = set(query) - {"filter"}
        if unknown:
            raise _invalid(
                sorted(unknown)[0], query[sorted(unknown)[0]], "The fake supports only 'filter' here."
            )
        wanted = None
        if "filter" in query:
            match = _OPS_FILTER.fullmatch(query["filter"])
            if match is None:
                raise _invalid("filter", query["filter"], "Invalid list filter expression.")
            wanted = match.group(1)
        for key in [k for k in self.instances if k[0] == zone]:
            self._observe(*key)
        self.tick()
        scope = f"projects/{project}/zones/{zone}"
        items = [
            copy.deepcopy(op)
            for op in self.operations.values()
            if op.get("zone") == _url(scope) and (wanted is None or op["targetId"] == wanted)
        ]
        answer: dict[str, Any] = {
            "kind": "compute#operationList",
            "id": f"{scope}/operations",
            "selfLink": _url(f"{scope}/operations"),
        }
        if items:
            answer["items"] = items
        return answer

    def seed_instance(
        self, project: str, zone: str, name: str, backing: Backing | None = None, status: str = STOPPED
    ) -> None:
        """Record an existing VM (made earlier, outside the test), optionally backed by something real."""
        zone_path = f"projects/{project}/zones/{zone}"
        self.instances[(zone, name)] = {
            "kind": "compute#instance",
            "id": _uint64_id(),
            "name": name,
            "zone": _url(zone_path),
            "machineType": _url(f"{zone_path}/machineTypes/e2-small"),
            "status": status,
            "selfLink": _url(f"{zone_path}/instances/{name}"),
            "creationTimestamp": self.now(),
            "labelFingerprint": fingerprint([{}, next(self._ids)]),
        }
        if backing is not None:
            self.backings[(zone, name)] = backing

    def get_guest_attributes(self, project: str, zone: str, name: str, query: dict[str, str]) -> dict:
        """instances.getGuestAttributes: what the guest wrote, by queryPath or variableKey.

        The guest environment writes its host keys at boot, and only when the instance metadata has
        enable-guest-attributes=TRUE; until then the path is not found (404), as in the API.
        """
        inst = self.get_instance(zone, name, project)
        path, variable = query.get("queryPath"), query.get("variableKey")
        if bool(path) == bool(variable):
            raise ApiError(400, "Exactly one of queryPath and variableKey must be set.", "invalid")
        items = {i["key"]: i.get("value", "") for i in (inst.get("metadata") or {}).get("items") or []}
        enabled = items.get("enable-guest-attributes", "").upper() == "TRUE"
        if inst["status"] != "RUNNING":
            self._booted.pop(inst["id"], None)
        elif enabled:
            self._booted.setdefault(inst["id"], time.monotonic())
        booted = self._booted.get(inst["id"])
        published = booted is not None and time.monotonic() >= booted + self.faults.hostkeys_delay
        entries = [
            {"namespace": "hostkeys", "key": kind, "value": value}
            for kind, value in sorted(self.host_keys.get(inst["id"], {}).items())
        ]
        where = f"projects/{project}/zones/{zone}/instances/{name}"
        wanted = path or variable or ""
        if path:
            found = [e for e in entries if f"{e['namespace']}/{e['key']}".startswith(path.lstrip("/"))]
        else:
            found = [e for e in entries if f"{e['namespace']}/{e['key']}" == wanted.lstrip("/")]
        if not published or not found:
            raise ApiError(404, f"The resource '{where}/guestAttributes/{wanted}' was not found", "notFound")
        from google.cloud import compute_v1

        answer: dict[str, Any] = {
            "kind": "compute#guestAttributes",
            "selfLink": _url(f"{where}/guestAttributes/{wanted}"),
        }
        if path:
            answer.update(queryPath=path, queryValue={"items": found})
        else:
            answer.update(variableKey=variable, variableValue=found[0]["value"])
        # Through the client's own message type: the answer has exactly the API's field names.
        message = compute_v1.GuestAttributes.from_json(json.dumps(answer), ignore_unknown_fields=False)
        return json.loads(
            compute_v1.GuestAttributes.to_json(message, always_print_fields_with_no_presence=False)
        )

    def list_instances(self, zone: str) -> dict[str, Any]:
        self.tick()
        items = [copy.deepcopy(v) for (z, _), v in sorted(self.instances.items()) if z == zone]
        answer: dict[str, Any] = {"kind": "compute#instanceList"}
        if items:  # the API leaves an empty list out
            answer["items"] = items
        return answer

    def insert_instance(self, project: str, zone: str, body: dict[str, Any]) -> dict:
        faults = self.faults
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
        created_disks = self._create_instance(project, zone, body)
        key = (zone, name)

        def rollback() -> None:
            inst = self.instances.pop(key, None)
            for dname in created_disks:
                self.disks.pop((zone, dname), None)
            for disk in (inst or {}).get("disks") or []:
                entry = self.disks.get((zone, _last(disk["source"])))
                if entry:
                    entry["users"] = [u for u in entry["users"] if u != inst["selfLink"]]

        def apply() -> dict[str, Any] | None:
            error = self._insert_error(project, zone)
            if error:
                rollback()
                return error
            now = self.now()
            inst = self.instances[key]
            inst["status"] = "RUNNING"
            inst["lastStartTimestamp"] = now
            inst["cpuPlatform"] = "Intel Broadwell"
            for disk in inst["disks"]:
                self.disks[(zone, _last(disk["source"]))]["lastAttachTimestamp"] = now
            return None

        return self._operation(
            project, zone, "insert", f"projects/{project}/zones/{zone}/instances/{name}", apply
        )

    def _insert_error(self, project: str, zone: str) -> dict[str, Any] | None:
        faults = self.faults
        if zone in faults.stockout_zones:
            return _stockout(project, zone)
        if faults.quota_operation:
            metric = faults.quota_operation
            return {
                "code": "QUOTA_EXCEEDED",
                "message": f"Quota '{metric}' exceeded.  Limit: 0.0 in region {zone[:-2]}.",
                "errorDetails": [
                    {
                        "quotaInfo": {
                            "metricName": f"compute.googleapis.com/{metric.lower()}",
                            "limitName": f"{metric.replace('_', '-')}-per-project-region",
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
        return None

    # ---- validation (what the real API refuses) ----------------------------------------------
    def _validate_instance(self, project: str, zone: str, body: dict[str, Any]) -> None:
        _parse("Instance", body, "instance")
        name = body.get("name") or ""
        if not _NAME.match(name):
            raise _invalid(
                "resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
            )
        if (zone, name) in self.instances:
            raise ApiError(
                409,
                f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists",
                "alreadyExists",
            )
        machine = _last(body.get("machineType") or "")
        if not machine:
            raise ApiError(
                400, "Invalid value for field 'resource.machineType': ''. Machine type is required."
            )
        shape = catalog.machine_shape(machine)
        if shape is None:
            raise _invalid(
                "resource.machineType",
                body["machineType"],
                f"Machine type with name '{machine}' does not exist in zone '{zone}'.",
            )
        sched = body.get("scheduling") or {}
        self._validate_scheduling(sched, "resource.scheduling")
        self._validate_accelerators(body.get("guestAccelerators") or [], machine, sched, zone)
        self._validate_disks(project, zone, name, body.get("disks") or [])
        self._validate_nics(project, zone, body.get("networkInterfaces") or [])
        self._validate_metadata((body.get("metadata") or {}).get("items") or [], "resource.metadata")
        self._validate_labels(body.get("labels") or {}, "resource.labels")
        for tag in (body.get("tags") or {}).get("items") or []:
            if not _NAME.match(tag):
                raise _invalid(
                    "resource.tags.items",
                    tag,
                    "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
                )
        accounts = body.get("serviceAccounts") or []
        if len(accounts) > 1:
            raise _invalid(
                "resource.serviceAccounts", len(accounts), "At most one service account is supported."
            )

    @staticmethod
    def _validate_scheduling(sched: dict[str, Any], where: str) -> None:
        for key, allowed in (
            ("onHostMaintenance", ON_HOST_MAINTENANCE),
            ("provisioningModel", PROVISIONING_MODELS),
            ("instanceTerminationAction", TERMINATION_ACTIONS),
        ):
            if key in sched and sched[key] not in allowed:
                raise _invalid(f"{where}.{key}", sched[key], f"Must be one of {sorted(allowed)}.")
        spot = sched.get("provisioningModel") == "SPOT" or sched.get("preemptible")
        if spot and sched.get("automaticRestart"):
            raise ApiError(
                400,
                "Invalid value for field 'resource.scheduling.automaticRestart': 'true'. "
                "Preemptible and Spot instances cannot be automatically restarted.",
            )
        if spot and sched.get("onHostMaintenance") == "MIGRATE":
            raise ApiError(
                400,
                "Invalid value for field 'resource.scheduling.onHostMaintenance': 'MIGRATE'. "
                "Preemptible and Spot instances cannot migrate on host maintenance.",
            )
        if "instanceTerminationAction" in sched and sched.get("provisioningModel") != "SPOT":
            raise ApiError(
                400,
                "Invalid value for field 'resource.scheduling.instanceTerminationAction'. "
                "Only Spot instances take a termination action.",
            )

    @staticmethod
    def _validate_accelerators(
        gpus: list[dict[str, Any]], machine: str, sched: dict[str, Any], zone: str
    ) -> None:
        if not gpus:
            return
        family, cpus, memory = catalog.machine_shape(machine) or ("", 0, 0.0)
        for index, gpu in enumerate(gpus):
            where = f"resource.guestAccelerators[{index}]"
            gtype = _last(gpu.get("acceleratorType") or "")
            count = int(gpu.get("acceleratorCount") or 0)
            if gtype not in catalog.ACCELERATOR_TYPES:
                raise _invalid(
                    f"{where}.acceleratorType",
                    gpu.get("acceleratorType"),
                    f"Accelerator type '{gtype}' does not exist in zone '{zone}'.",
                )
            if count <= 0:
                raise _invalid(f"{where}.acceleratorCount", count, "The accelerator count must be positive.")
            if family != "n1" or machine in ("f1-micro", "g1-small"):
                raise ApiError(
                    400,
                    f"[{gtype}] features are not compatible for creating instance: "
                    f"machine type {machine} takes no {gtype}.",
                )
            limits = catalog.N1_GPU_LIMITS[gtype]
            if count not in limits:
                raise _invalid(
                    f"{where}.acceleratorCount",
                    count,
                    f"{gtype} can be attached in counts of {', '.join(map(str, sorted(limits)))}.",
                )
            max_cpus, max_gb = limits[count]
            if cpus > max_cpus or memory > max_gb:
                raise ApiError(
                    400,
                    f"Invalid value for field 'resource.machineType': '{machine}'. "
                    f"{count} x {gtype} supports at most {max_cpus} vCPUs and {max_gb:g} GB of memory.",
                )
        if _scheduling_defaults(sched)["onHostMaintenance"] != "TERMINATE":
            raise ApiError(
                400,
                "Instances with guest accelerators do not support live migration. "
                "Set 'scheduling.onHostMaintenance' to TERMINATE.",
            )

    def _validate_disks(self, project: str, zone: str, name: str, disks: list[dict[str, Any]]) -> None:
        if not disks or not disks[0].get("boot") or sum(bool(d.get("boot")) for d in disks) != 1:
            raise ApiError(
                400,
                "Invalid value for field 'resource.disks': ''. Exactly one boot disk must be "
                "given, and it must be the first disk.",
            )
        seen_devices: set[str] = set()
        for index, disk in enumerate(disks):
            where = f"resource.disks[{index}]"
            if ("source" in disk) == ("initializeParams" in disk):
                raise ApiError(
                    400,
                    f"Invalid value for field '{where}': exactly one of source and "
                    "initializeParams must be given.",
                )
            if disk.get("mode", "READ_WRITE") not in DISK_MODES:
                raise _invalid(f"{where}.mode", disk["mode"], f"Must be one of {sorted(DISK_MODES)}.")
            if disk.get("interface", "SCSI") not in DISK_INTERFACES:
                raise _invalid(
                    f"{where}.interface", disk["interface"], f"Must be one of {sorted(DISK_INTERFACES)}."
                )
            if disk.get("type", "PERSISTENT") not in ("PERSISTENT", "SCRATCH"):
                raise _invalid(f"{where}.type", disk["type"], "Must be PERSISTENT or SCRATCH.")
            device = disk.get("deviceName")
            if device:
                if device in seen_devices:
                    raise _invalid(f"{where}.deviceName", device, "Device names must be unique.")
                seen_devices.add(device)
            if "source" in disk:
                key = (zone, _last(disk["source"]))
                if key not in self.disks:
                    raise ApiError(404, f"The resource '{disk['source']}' was not found", "notFound")
                if self.disks[key]["users"]:
                    raise ApiError(
                        400,
                        f"The disk resource '{self.disks[key]['selfLink']}' is already being "
                        f"used by '{self.disks[key]['users'][0]}'",
                        "resourceInUseByAnotherResource",
                    )
                continue
            params = disk["initializeParams"]
            dname = params.get("diskName") or name
            if not _NAME.match(dname):
                raise _invalid(
                    f"{where}.initializeParams.diskName",
                    dname,
                    "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
                )
            dtype = _last(params.get("diskType") or "pd-standard")
            if dtype not in catalog.DISK_TYPES:
                raise _invalid(
                    f"{where}.initializeParams.diskType",
                    params.get("diskType"),
                    f"Disk type '{dtype}' does not exist in zone '{zone}'.",
                )
            source_image = params.get("sourceImage")
            img = catalog.image(source_image) if source_image else None
            if source_image and img is None:
                raise ApiError(404, f"The resource '{source_image}' was not found", "notFound")
            if disk.get("boot") and not source_image:
                raise ApiError(
                    400,
                    f"Invalid value for field '{where}.initializeParams': a boot disk needs "
                    "sourceImage, sourceSnapshot or source.",
                )
            if "diskSizeGb" in params:
                size = int(params["diskSizeGb"])
                if size < catalog.MIN_DISK_GB or size > catalog.MAX_DISK_GB:
                    raise _invalid(
                        f"{where}.initializeParams.diskSizeGb",
                        size,
                        f"Disk size must be between {catalog.MIN_DISK_GB} and {catalog.MAX_DISK_GB} GB.",
                    )
                if img and size < img[2]:
                    raise _invalid(
                        f"{where}.initializeParams.diskSizeGb",
                        size,
                        f"Requested disk size cannot be smaller than the image size ({img[2]} GB)",
                    )
            existing = self.disks.get((zone, dname))
            if existing and existing["users"]:
                raise ApiError(
                    400,
                    f"The disk resource '{existing['selfLink']}' is already being used by "
                    f"'{existing['users'][0]}'",
                    "resourceInUseByAnotherResource",
                )

    def _validate_nics(self, project: str, zone: str, nics: list[dict[str, Any]]) -> None:
        for index, nic in enumerate(nics or [{}]):
            where = f"resource.networkInterfaces[{index}]"
            network = _last(nic.get("network") or "default")
            if network not in self.networks:
                raise ApiError(
                    404,
                    f"The resource 'projects/{project}/global/networks/{network}' was not found",
                    "notFound",
                )
            if nic.get("subnetwork"):
                sub = _last(nic["subnetwork"])
                region = catalog_region(zone)
                subnets = self.networks[network]
                known = sub == network if subnets is None else f"{region}/{sub}" in subnets
                if not known:
                    raise ApiError(
                        404,
                        f"The resource 'projects/{project}/regions/{region}/subnetworks/{sub}' was not found",
                        "notFound",
                    )
            elif self.networks[network] is not None:
                raise ApiError(
                    400,
                    f"Invalid value for field '{where}.subnetwork': ''. Network '{network}' is in "
                    "custom subnet mode: a subnetwork is required.",
                )
            for ac_index, access in enumerate(nic.get("accessConfigs") or []):
                if access.get("type", "ONE_TO_ONE_NAT") != "ONE_TO_ONE_NAT":
                    raise _invalid(
                        f"{where}.accessConfigs[{ac_index}].type", access["type"], "Must be ONE_TO_ONE_NAT."
                    )
                if access.get("networkTier", "PREMIUM") not in NETWORK_TIERS:
                    raise _invalid(
                        f"{where}.accessConfigs[{ac_index}].networkTier",
                        access["networkTier"],
                        f"Must be one of {sorted(NETWORK_TIERS)}.",
                    )

    @staticmethod
    def _validate_metadata(items: list[dict[str, Any]], where: str) -> None:
        keys = [item.get("key", "") for item in items]
        for key in keys:
            if not _METADATA_KEY.match(key):
                raise _invalid(f"{where}.items.key", key, "Must be a match of regex '[a-zA-Z0-9-_]{1,128}'")
        if len(set(keys)) != len(keys):
            raise ApiError(400, f"Invalid value for field '{where}': duplicate metadata keys.")
        if (
            sum(len(k) + len(item.get("value") or "") for k, item in zip(keys, items, strict=True))
            > 512 * 1024
        ):
            raise ApiError(400, f"Invalid value for field '{where}': metadata is limited to 512 KB in total.")

    @staticmethod
    def _validate_labels(labels: dict[str, str], where: str) -> None:
        if len(labels) > 64:
            raise _invalid(where, len(labels), "At most 64 labels.")
        for key, value in labels.items():
            if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(str(value)):
                raise _invalid(
                    f"{where}",
                    f"{key}={value}",
                    "Label keys and values must be lowercase letters, "
                    "digits, '_' or '-', keys starting with a letter, at most 63 characters.",
                )

    # ---- creation: what the API fills in -----------------------------------------------------
    def _create_instance(self, project: str, zone: str, body: dict[str, Any]) -> list[str]:
        """Record the VM as PROVISIONING with every server-side field; returns the disks it created."""
        name = body["name"]
        zone_path = f"projects/{project}/zones/{zone}"
        self_link = _url(f"{zone_path}/instances/{name}")
        now = self.now()
        disks, created = [], []
        for index, disk in enumerate(body.get("disks") or []):
            if "source" in disk:
                dname = _last(disk["source"])
            else:
                params = disk.get("initializeParams") or {}
                dname = params.get("diskName") or name
                if (zone, dname) not in self.disks:  # an existing free disk of that name is attached
                    self._new_disk(project, zone, dname, params)
                    created.append(dname)
            entry = self.disks[(zone, dname)]
            entry["users"].append(self_link)
            attached = {
                "kind": "compute#attachedDisk",
                "type": disk.get("type", "PERSISTENT"),
                "mode": disk.get("mode", "READ_WRITE"),
                "source": entry["selfLink"],
                "deviceName": disk.get("deviceName") or f"persistent-disk-{index}",
                "index": index,
                "boot": bool(disk.get("boot", False)),
                "autoDelete": bool(disk.get("autoDelete", False)),
                "interface": disk.get("interface", "SCSI"),
                "diskSizeGb": entry["sizeGb"],
                "architecture": "X86_64",
            }
            if entry.get("licenses"):
                attached["licenses"] = list(entry["licenses"])
                attached["guestOsFeatures"] = copy.deepcopy(entry["guestOsFeatures"])
            disks.append(attached)
        nics = []
        for index, nic in enumerate(body.get("networkInterfaces") or [{}]):
            network = _last(nic.get("network") or "default")
            sub = _last(nic["subnetwork"]) if nic.get("subnetwork") else network
            out = {
                "kind": "compute#networkInterface",
                "network": _url(f"projects/{project}/global/networks/{network}"),
                "subnetwork": _url(f"projects/{project}/regions/{catalog_region(zone)}/subnetworks/{sub}"),
                "networkIP": nic.get("networkIP") or f"10.128.0.{next(self._ips)}",
                "name": f"nic{index}",
                "stackType": nic.get("stackType", "IPV4_ONLY"),
            }
            if nic.get("accessConfigs"):
                out["accessConfigs"] = [
                    {
                        "kind": "compute#accessConfig",
                        "type": "ONE_TO_ONE_NAT",
                        "name": ac.get("name", "External NAT"),
                        "natIP": ac.get("natIP") or f"203.0.113.{next(self._ips)}",
                        "networkTier": ac.get("networkTier", "PREMIUM"),
                    }
                    for ac in nic["accessConfigs"]
                ]
            out["fingerprint"] = fingerprint(out)
            nics.append(out)
        items = list((body.get("metadata") or {}).get("items") or [])
        tags = list((body.get("tags") or {}).get("items") or [])
        labels = dict(body.get("labels") or {})
        inst: dict[str, Any] = {
            "kind": "compute#instance",
            # Unique across fakes too, as the API's 64-bit ids are (host key aliases hold them).
            "id": _uint64_id(),
            "creationTimestamp": now,
            "name": name,
            "tags": {"fingerprint": fingerprint(tags)},
            "machineType": _url(f"{zone_path}/machineTypes/{_last(body['machineType'])}"),
            "status": "PROVISIONING",
            "zone": _url(zone_path),
            "canIpForward": bool(body.get("canIpForward", False)),
            "networkInterfaces": nics,
            "disks": disks,
            "metadata": {"kind": "compute#metadata", "fingerprint": fingerprint(items)},
            "selfLink": self_link,
            "scheduling": _scheduling_defaults(body.get("scheduling") or {}),
            "cpuPlatform": "Unknown CPU Platform",
            "labelFingerprint": fingerprint(labels),
            "startRestricted": False,
            "deletionProtection": bool(body.get("deletionProtection", False)),
            "shieldedInstanceConfig": {
                "enableSecureBoot": False,
                "enableVtpm": True,
                "enableIntegrityMonitoring": True,
            },
            "shieldedInstanceIntegrityPolicy": {"updateAutoLearnPolicy": True},
            "fingerprint": fingerprint([name, now]),
            "satisfiesPzi": True,
        }
        if tags:
            inst["tags"]["items"] = tags
        if items:
            inst["metadata"]["items"] = items
        if labels:
            inst["labels"] = labels
        if body.get("description"):
            inst["description"] = body["description"]
        if body.get("guestAccelerators"):
            inst["guestAccelerators"] = [
                {
                    "acceleratorType": _url(f"{zone_path}/acceleratorTypes/{_last(g['acceleratorType'])}"),
                    "acceleratorCount": int(g.get("acceleratorCount", 1)),
                }
                for g in body["guestAccelerators"]
            ]
        if body.get("serviceAccounts"):
            inst["serviceAccounts"] = [_service_account(sa) for sa in body["serviceAccounts"]]
        self.instances[(zone, name)] = inst
        self.host_keys[inst["id"]] = new_host_keys()
        return created

    def _new_disk(self, project: str, zone: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
        zone_path = f"projects/{project}/zones/{zone}"
        img = catalog.image(params["sourceImage"]) if params.get("sourceImage") else None
        size = params.get("diskSizeGb") or (img[2] if img else catalog.DEFAULT_EMPTY_DISK_GB)
        disk: dict[str, Any] = {
            "kind": "compute#disk",
            "id": str(next(self._ids)) + "5501",
            "creationTimestamp": self.now(),
            "name": name,
            "sizeGb": str(size),
            "zone": _url(zone_path),
            "status": "READY",
            "selfLink": _url(f"{zone_path}/disks/{name}"),
            "type": _url(f"{zone_path}/diskTypes/{_last(params.get('diskType') or 'pd-standard')}"),
            "labelFingerprint": fingerprint({}),
            "physicalBlockSizeBytes": "4096",
            "architecture": "X86_64",
            "satisfiesPzi": True,
            "users": [],
        }
        if img:
            project_img, image_name, _, license_ = img
            disk["sourceImage"] = _url(f"projects/{project_img}/global/images/{image_name}")
            disk["sourceImageId"] = str(next(self._ids)) + "3301"
            disk["licenses"] = [_url(f"projects/{project_img}/global/licenses/{license_}")]
            disk["guestOsFeatures"] = [
                {"type": t} for t in ("UEFI_COMPATIBLE", "VIRTIO_SCSI_MULTIQUEUE", "GVNIC", "SEV_CAPABLE")
            ]
        self.disks[(zone, name)] = disk
        return disk

    def delete_instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        inst = self.get_instance(zone, name, project)
        self.instances[(zone, name)]["status"] = "STOPPING"

        def apply() -> None:
            for disk in inst["disks"]:
                key = (zone, _last(disk["source"]))
                if key in self.disks:
                    self.disks[key]["users"] = [u for u in self.disks[key]["users"] if u != inst["selfLink"]]
                    self.disks[key]["lastDetachTimestamp"] = self.now()
                    if disk["autoDelete"]:
                        del self.disks[key]
            self.instances.pop((zone, name), None)

        return self._operation(
            project, zone, "delete", f"projects/{project}/zones/{zone}/instances/{name}", apply
        )

    def instance_action(self, project: str, zone: str, name: str, verb: str, body: dict[str, Any]) -> dict:
        inst = self.get_instance(zone, name, project)
        live = self.instances[(zone, name)]
        stopped = inst["status"] == STOPPED
        needs_stop = {"setMachineType", "setMachineResources", "setServiceAccount"}
        fingerprinted = {
            "setLabels": "labelFingerprint",
            "setMetadata": "fingerprint",
            "setTags": "fingerprint",
        }
        known = needs_stop | set(fingerprinted) | {"start", "stop", "setScheduling"}
        if verb not in known:
            raise ApiError(400, f"The fake does not implement instances.{verb}.")
        if verb in _ACTION_MESSAGES:
            _parse(_ACTION_MESSAGES[verb], body, verb)
        if verb in needs_stop and not stopped:
            raise ApiError(
                400,
                f"The resource '{inst['selfLink']}' is not ready: instances.{verb} needs the "
                f"instance stopped (it is {inst['status']}).",
                "resourceNotReady",
            )
        if verb in fingerprinted:
            current = (
                inst["labelFingerprint"] if verb == "setLabels" else inst[verb[3:].lower()]["fingerprint"]
            )
            if body.get(fingerprinted[verb]) != current:
                raise ApiError(
                    412, "Supplied fingerprint does not match current fingerprint.", "conditionNotMet"
                )
        gpus = inst.get("guestAccelerators") or []
        machine = _last(inst["machineType"])
        if verb == "setScheduling":
            self._validate_scheduling(body, "resource")
            if not stopped and _scheduling_defaults(body).get("provisioningModel") != inst["scheduling"].get(
                "provisioningModel"
            ):
                raise ApiError(
                    400, "The provisioning model can only be changed while the instance is stopped."
                )
            if gpus and _scheduling_defaults(body)["onHostMaintenance"] != "TERMINATE":
                raise ApiError(
                    400,
                    "Instances with guest accelerators do not support live migration. "
                    "Set 'scheduling.onHostMaintenance' to TERMINATE.",
                )
        if verb == "setMachineType":
            machine = _last(body.get("machineType") or "")
            if catalog.machine_shape(machine) is None:
                raise _invalid(
                    "machineType",
                    body.get("machineType"),
                    f"Machine type with name '{machine}' does not exist in zone '{zone}'.",
                )
            self._validate_accelerators(gpus, machine, inst["scheduling"], zone)
        if verb == "setMachineResources":
            self._validate_accelerators(
                body.get("guestAccelerators") or [], machine, inst["scheduling"], zone
            )
        if verb == "setMetadata":
            self._validate_metadata(body.get("items") or [], "metadata")
        if verb == "setLabels":
            self._validate_labels(body.get("labels") or {}, "labels")
        if verb == "stop" and inst["status"] in ("RUNNING", "STAGING", "PROVISIONING"):
            live["status"] = "STOPPING"
        if verb == "start" and stopped:
            live["status"] = "STAGING"

        def apply() -> dict[str, Any] | None:
            live = self.instances[(zone, name)]
            if verb == "start":
                if live["status"] == "STAGING" and zone in self.faults.stockout_zones:
                    live["status"] = STOPPED
                    return _stockout(project, zone)
                if (zone, name) in self.backings:
                    try:
                        self.backings[(zone, name)].start()
                    except RuntimeError as exc:  # what runs behind it would not start
                        live["status"] = STOPPED
                        return {"code": "INTERNAL_ERROR", "message": str(exc), "_http": 500}
                live["status"] = "RUNNING"
                live["lastStartTimestamp"] = self.now()
            elif verb == "stop":
                if (zone, name) in self.backings:
                    self.backings[(zone, name)].stop()
                live["status"] = STOPPED
                live["lastStopTimestamp"] = self.now()
            elif verb == "setMachineType":
                live["machineType"] = _url(f"projects/{project}/zones/{zone}/machineTypes/{machine}")
            elif verb == "setMachineResources":
                gpus = [
                    {
                        "acceleratorType": _url(
                            f"projects/{project}/zones/{zone}/acceleratorTypes/{_last(g['acceleratorType'])}"
                        ),
                        "acceleratorCount": int(g.get("acceleratorCount", 1)),
                    }
                    for g in body.get("guestAccelerators") or []
                ]
                if gpus:
                    live["guestAccelerators"] = gpus
                else:
                    live.pop("guestAccelerators", None)
            elif verb == "setScheduling":
                live["scheduling"] = _scheduling_defaults(body)
            elif verb == "setServiceAccount":
                live["serviceAccounts"] = [_service_account(body)] if body.get("email") else []
            elif verb == "setLabels":
                labels = dict(body.get("labels") or {})
                live["labels"] = labels
                if not labels:
                    live.pop("labels")
                live["labelFingerprint"] = fingerprint([labels, next(self._ids)])
            elif verb == "setMetadata":
                items = list(body.get("items") or [])
                live["metadata"] = {
                    "kind": "compute#metadata",
                    "fingerprint": fingerprint([items, next(self._ids)]),
                }
                if items:
                    live["metadata"]["items"] = items
            elif verb == "setTags":
                items = list(body.get("items") or [])
                live["tags"] = {"fingerprint": fingerprint([items, next(self._ids)])}
                if items:
                    live["tags"]["items"] = items
            return None

        return self._operation(
            project, zone, verb, f"projects/{project}/zones/{zone}/instances/{name}", apply, inst["id"]
        )

    # ---- disks -------------------------------------------------------------------------------
    def add_disk(
        self, project: str, zone: str, name: str, size_gb: int = 250, disk_type: str = "pd-balanced"
    ) -> None:
        """Seed a detached disk, as a previous teardown leaves the data disk."""
        self._new_disk(project, zone, name, {"diskSizeGb": str(size_gb), "diskType": disk_type})

    def get_disk(self, zone: str, name: str, project: str | None = None) -> dict[str, Any]:
        self.tick()
        disk = self.disks.get((zone, name))
        if disk is None:
            raise _not_found(_scope(project, f"zones/{zone}/disks/{name}"))
        out = copy.deepcopy(disk)
        if not out["users"]:
            del out["users"]
        return out

    def delete_disk(self, project: str, zone: str, name: str) -> dict[str, Any]:
        disk = self.get_disk(zone, name, project)
        if disk.get("users"):
            raise ApiError(
                400,
                f"The disk resource '{disk['selfLink']}' is already being used by '{disk['users'][0]}'",
                "resourceInUseByAnotherResource",
            )
        return self._operation(
            project,
            zone,
            "delete",
            f"projects/{project}/zones/{zone}/disks/{name}",
            lambda: self.disks.pop((zone, name), None) and None,
        )

    # ---- firewalls ---------------------------------------------------------------------------
    # What the API fills in on a rule, as the Firewall reference says
    # (https://cloud.google.com/compute/docs/reference/rest/v1/firewalls): kind compute#firewall, a
    # server-defined id (uint64, a JSON string), creationTimestamp (RFC 3339), selfLink, network as a
    # URL ("If not specified when creating a firewall rule, the default network is used"), "The default
    # value [of priority] is 1000", direction "The default is INGRESS", and a rule that is "enabled" when
    # disabled is unspecified. A rule read back writes the last two out, with logConfig, as
    # ``"disabled": false`` and ``"logConfig": {"enable": false}``: real rules in
    # https://github.com/cloud-custodian/cloud-custodian/issues/6248 ("The gcp.firewall value filter
    # ``"logConfig": {"enable": false}`` tells me if logging is enabled or not").
    def get_firewall(self, name: str, project: str | None = None) -> dict[str, Any]:
        if name not in self.firewalls:
            raise _not_found(_scope(project, f"global/firewalls/{name}"))
        return copy.deepcopy(self.firewalls[name])

    def insert_firewall(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        """firewalls.insert: the rule as sent, with every server default written out."""
        self._validate_firewall(project, body, insert=True)
        name = body["name"]
        if name in self.firewalls:
            raise ApiError(
                409,
                f"The resource 'projects/{project}/global/firewalls/{name}' already exists",
                "alreadyExists",
            )
        rule = _firewall_stored(
            project,
            name,
            body,
            {"kind": "compute#firewall", "id": _uint64_id(), "creationTimestamp": self.now()},
        )

        def apply() -> None:
            self.firewalls[name] = rule

        return self._operation(project, None, "insert", f"projects/{project}/global/firewalls/{name}", apply)

    def patch_firewall(self, project: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """firewalls.patch: "This method supports PATCH semantics and uses the JSON merge patch format
        and processing rules" (the reference): what the body names replaces or (null) removes, objects
        merge field by field, and everything it leaves out stays as it was."""
        if name not in self.firewalls:
            raise _not_found(f"projects/{project}/global/firewalls/{name}")
        self._validate_firewall(project, body, insert=False)
        # Output-only fields and the name are the server's: a body naming them changes nothing. A
        # field may come by its proto name (source_ranges), which the JSON mapping also takes.
        fields = _json_names("Firewall")
        patch = {
            fields.get(k, k): v
            for k, v in body.items()
            if fields.get(k, k) not in _FIREWALL_OUTPUT_ONLY | {"name"}
        }

        def patched() -> dict[str, Any]:
            current = self.firewalls[name]
            server = {k: current[k] for k in _FIREWALL_OUTPUT_ONLY - {"selfLink"}}
            return _firewall_stored(project, name, merge_patch(current, patch), server)

        patched()  # a patch whose result the API could not keep is refused now, before any operation

        def apply() -> None:
            self.firewalls[name] = patched()  # merged into the rule as it is when the operation ends

        return self._operation(project, None, "patch", f"projects/{project}/global/firewalls/{name}", apply)

    def update_firewall(self, project: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """firewalls.update (PUT): "Note that all fields will be updated if using PUT, even fields that
        are not specified. To update individual fields, please use PATCH instead." (the v1 reference,
        https://cloud.google.com/compute/docs/reference/rest/v1/firewalls/update). The body replaces
        the rule whole: a field it leaves out takes the server's default, as on insert; the
        output-only fields (kind, id, creationTimestamp, selfLink) stay the server's."""
        if name not in self.firewalls:
            raise _not_found(f"projects/{project}/global/firewalls/{name}")
        self._validate_firewall(project, body, insert=False)
        if body.get("name") != name:
            # The rule is named by the URL; no public source was found for the API's words when a
            # body names another (wording not verified).
            raise _invalid(
                "resource.name", body.get("name") or "", f"Must match the firewall rule's name '{name}'."
            )
        current = self.firewalls[name]
        rule = _firewall_stored(
            project, name, body, {k: current[k] for k in _FIREWALL_OUTPUT_ONLY - {"selfLink"}}
        )

        def apply() -> None:
            self.firewalls[name] = rule

        return self._operation(project, None, "update", f"projects/{project}/global/firewalls/{name}", apply)

    def delete_firewall(self, project: str, name: str) -> dict[str, Any]:
        self.get_firewall(name, project)
        return self._operation(
            project,
            None,
            "delete",
            f"projects/{project}/global/firewalls/{name}",
            lambda: self.firewalls.pop(name, None) and None,
        )

    def _validate_firewall(self, project: str, body: dict[str, Any], insert: bool) -> None:
        _parse("Firewall", body, "resource")
        name = body.get("name") or ""
        if insert and not _NAME.match(name):
            # The API's words for a bad name on a global resource's insert ("Error 400: Invalid value
            # for field 'resource.name': 'guillaume.dupin-tfa0be-dcos-network'. Must be a match of regex
            # '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)', invalid"),
            # https://github.com/mesosphere-backup/terraform-dcos/issues/39.
            raise _invalid(
                "resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
            )
        for key in ("allowed", "denied"):
            for index, entry in enumerate(body.get(key) or []):
                if not entry.get("IPProtocol"):
                    # A firewalls.insert refused in these words (the whole JSON error body):
                    # https://github.com/googleapis/google-cloud-java/issues/4292.
                    raise _invalid(
                        f"resource.{key}[{index}].IPProtocol",
                        entry.get("IPProtocol") or "",
                        "Invalid IP protocol specification.",
                    )
        for where, value, allowed in (
            ("resource.direction", body.get("direction"), _enum_names("Firewall", "Direction")),
            (
                "resource.logConfig.metadata",
                (body.get("logConfig") or {}).get("metadata"),
                _enum_names("FirewallLogConfig", "Metadata"),
            ),
        ):
            if value is not None and value not in allowed:
                raise _invalid(where, value, f"Must be one of {sorted(allowed)}.")  # wording not verified
        priority = body.get("priority")
        if priority is not None and not 0 <= int(priority) <= 65535:
            # The range is the reference's ("an integer between 0 and 65535, both inclusive");
            # wording not verified.
            raise _invalid("resource.priority", priority, "Must be between 0 and 65535, both inclusive.")
        network = _last(body.get("network") or "default")
        if body.get("network") is not None and network not in self.networks:
            raise _not_found(f"projects/{project}/global/networks/{network}")


# The Firewall reference's JSON representation, in its order; the first four and selfLink are
# output only ("params" is input only: never stored).
_FIREWALL_FIELDS = (
    "kind", "id", "creationTimestamp", "name", "description", "network", "priority", "sourceRanges",
    "destinationRanges", "sourceTags", "targetTags", "sourceServiceAccounts", "targetServiceAccounts",
    "allowed", "denied", "direction", "logConfig", "disabled", "selfLink",
)  # fmt: skip
_FIREWALL_OUTPUT_ONLY = frozenset({"kind", "id", "creationTimestamp", "selfLink"})


def _enum_names(message: str, enum: str) -> frozenset[str]:
    """The values the client's type lists for a string field (Firewall.Direction: INGRESS, EGRESS)."""
    from google.cloud import compute_v1

    values = getattr(getattr(compute_v1, message), enum)
    return frozenset(v.name for v in values if not v.name.startswith("UNDEFINED"))


def _json_names(message: str) -> dict[str, str]:
    """A message's JSON field names by proto name (source_ranges -> sourceRanges)."""
    from google.cloud import compute_v1

    return {f.name: f.json_name for f in getattr(compute_v1, message).pb().DESCRIPTOR.fields}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 (JSON merge patch): a patch object merges into the target key by key, null removes
    a key, and anything else (a list included) replaces the value whole."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _firewall_stored(project: str, name: str, body: dict[str, Any], server: dict[str, Any]) -> dict[str, Any]:
    """A rule as the API keeps it: the body with the server's fields and defaults, the network and
    selfLink as URLs, written by the client's own Firewall type (integers as numbers, the id as a
    string, camelCase names, no empty lists) in the reference's order, and held to strict.py's check
    of an answer, so a rule the API could not send is never kept."""
    from google.cloud import compute_v1

    from tests.fake_compute import strict

    merged = {k: v for k, v in body.items() if k not in _FIREWALL_OUTPUT_ONLY and k != "params"}
    merged.update(server, name=name, selfLink=_url(f"projects/{project}/global/firewalls/{name}"))
    network = _last(merged.get("network") or "default")
    merged["network"] = _url(f"projects/{project}/global/networks/{network}")
    if merged.get("priority") is None:
        merged["priority"] = 1000
    if merged.get("direction") is None:
        merged["direction"] = "INGRESS"
    if merged.get("disabled") is None:
        merged["disabled"] = False
    merged["logConfig"] = dict(merged.get("logConfig") or {})
    if merged["logConfig"].get("enable") is None:
        merged["logConfig"]["enable"] = False
    message = compute_v1.Firewall.from_json(json.dumps(merged), ignore_unknown_fields=False)
    written = json.loads(compute_v1.Firewall.to_json(message, always_print_fields_with_no_presence=False))
    rule = {k: written[k] for k in _FIREWALL_FIELDS if k in written}
    try:
        strict.check_message("Firewall", rule)
    except strict.ResponseMismatch as exc:  # the fake's own fault: answered as the server does one
        raise ApiError(500, f"The fake's answer is not the API's: {exc}", "backendError") from exc
    return rule


_ACTION_MESSAGES = {
    "setMachineType": "InstancesSetMachineTypeRequest",
    "setMachineResources": "InstancesSetMachineResourcesRequest",
    "setServiceAccount": "InstancesSetServiceAccountRequest",
    "setLabels": "InstancesSetLabelsRequest",
    "setMetadata": "Metadata",
    "setTags": "Tags",
    "setScheduling": "Scheduling",
}


def catalog_region(zone: str) -> str:
    """us-central1-a -> us-central1."""
    return zone.rsplit("-", 1)[0]


def _stockout(project: str, zone: str) -> dict[str, Any]:
    return {
        "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
        "fulfill the request.  '(resource type:compute)'.",
        "errorDetails": [
            {
                "help": {
                    "links": [
                        {
                            "description": "Troubleshooting documentation",
                            "url": "https://cloud.google.com/compute/docs/resource-error",
                        }
                    ]
                }
            },
            {
                "localizedMessage": {
                    "locale": "en-US",
                    "message": f"A VM instance is currently unavailable in the {zone} zone. Alternatively, "
                    "you can try your request again with a different VM hardware configuration or at a "
                    "later time. For more information, see the troubleshooting documentation.",
                }
            },
            {
                "errorInfo": {
                    "domain": "compute.googleapis.com",
                    "reason": "resource_availability",
                    "metadatas": {"zone": zone, "zonesAvailable": ""},
                }
            },
        ],
        "_http": 503,
    }


def _scheduling_defaults(sched: dict[str, Any]) -> dict[str, Any]:
    """Scheduling as the API stores it: every default written out (Scheduling reference)."""
    out = dict(sched)
    spot = out.get("provisioningModel") == "SPOT" or bool(out.get("preemptible"))
    out.setdefault("provisioningModel", "STANDARD")
    out.setdefault("preemptible", False)
    out.setdefault("onHostMaintenance", "TERMINATE" if spot else "MIGRATE")
    out.setdefault("automaticRestart", not spot)
    return out


def _service_account(account: dict[str, Any]) -> dict[str, Any]:
    """``default`` is the project's Compute Engine default service account, stored by its email."""
    email = account.get("email") or ""
    return {"email": DEFAULT_SA if email == "default" else email, "scopes": list(account.get("scopes") or [])}


def _ssh_string(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def new_host_keys() -> dict[str, str]:
    """A fresh VM's host keys as its guest publishes them: SSH public key blobs, base64."""
    import os

    ed25519 = _ssh_string(b"ssh-ed25519") + _ssh_string(os.urandom(32))
    ecdsa = (
        _ssh_string(b"ecdsa-sha2-nistp256") + _ssh_string(b"nistp256") + _ssh_string(b"\x04" + os.urandom(64))
    )
    return {
        "ssh-ed25519": base64.b64encode(ed25519).decode(),
        "ecdsa-sha2-nistp256": base64.b64encode(ecdsa).decode(),
    }
