"""The fake Cloud TPU API's state: queued resources, nodes, operations, injected faults, request log.

Built from the Cloud TPU REST reference (v2 nodes and operations, v2alpha1 queuedResources), not
from what tpu_node sends:

- Strict on input: a queued resource body is parsed with the released client's v2alpha1 message
  types (unknown fields and bad enum values are refused), and so are a bad queuedResourceId, a
  nodeSpec whose parent is not the request's, a missing acceleratorType or runtimeVersion, an
  accelerator type or runtime the zone does not offer, two tiers at once, a run duration without
  flex-start (or above 7 days), and flex-start where the zone does not offer it for the type.
- Filled in on output: the queued resource's name, createTime and state; the node's full name,
  state, health, id, createTime, apiVersion, cidrBlock, the project's default service account,
  networkConfig with the region's default subnetwork, networkEndpoints with an internal IP, port
  8470 and an external IP, acceleratorConfig, and the queued resource that owns it.
- A queued resource goes CREATING -> WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE as time passes
  (then its node is READY), or to FAILED with ``failedData.error`` (capacity, quota), or to FAILED
  when its ``queueingPolicy`` validUntil passes while it still waits (the service's clock starts at
  the create). Flex-start running out deletes the node and leaves the request SUSPENDED, as the
  service does; someone else's delete shows as DELETING until it is gone; a node can be put in any
  Node.State (``set_node_state``).
- Quota by provisioning model: on-demand counts against the on-demand quota; spot and flex-start
  against the preemptible one (https://cloud.google.com/tpu/docs/request-using-flex-start: "ensure
  you have sufficient preemptible quota").
- An operation is read on the API version that started it; another version answers 404.
- Strict on output too: server.py parses every answer with the released client's types
  (``strict.py``) before it is sent, so a misspelt field fails the request.
- Errors are Google's JSON shape for gRPC-based APIs: ``{"error": {code, message, status, details}}``;
  quota is RESOURCE_EXHAUSTED (HTTP 429) naming the quota, with a QuotaFailure detail.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

PROJECT_NUMBER = "123456789012"
DEFAULT_SA = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
_ID = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Zones that offer v5e (v5litepod) in the Cloud TPU regions table, and what they take.
ZONES = frozenset(
    {"us-west4-a", "us-west4-b", "us-east1-c", "us-east5-a", "us-east5-b", "us-central1-a", "us-south1-a",
     "europe-west4-a", "europe-west4-b", "asia-southeast1-b"}
)  # fmt: skip
ACCELERATOR_TYPES = frozenset({"v5litepod-1", "v5litepod-4", "v5litepod-8", "v5litepod-16", "v5litepod-256"})
RUNTIMES = frozenset({"v2-alpha-tpuv5-lite", "v2-tpuv5-litepod", "tpu-ubuntu2204-base"})
QUOTA = "TPUV5sLitepodPerProjectPerZoneForTPUAPI"
QUOTA_SPOT = "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"
PROVISIONING_MODELS = frozenset({"PROVISIONING_MODEL_UNSPECIFIED", "STANDARD", "SPOT", "FLEX_START"})
MAX_RUN_SECONDS = 7 * 86400
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
_SA_EMAIL = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]@[-a-z0-9.:]+\.gserviceaccount\.com")
STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED",
          412: "FAILED_PRECONDITION", 500: "INTERNAL", 503: "UNAVAILABLE"}  # fmt: skip
# The live API's stockout, as quoted in https://github.com/GoogleCloudPlatform/magic-modules/pull/7297
# ("Error code 8, message: There is no more capacity in the zone ...").
CAPACITY = (
    'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU Nodes '
    "are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1f2e3d4c5b6a7980]"
)
# The live API's two wordings for an accelerator type a zone does not offer, as an outside review of
# this project quoted them from the service (docs/tpu.md, "Zones and stockouts"). Kept verbatim,
# not written to fit tpu_node's pattern.
NOT_OFFERED = {
    "zonal": 'The requested accelerator configuration for accelerator type, "{accel}", could not be found '
    'in the zonal accelerator configurations for "{zone}".',
    "zone": "the accelerator {accel} was not found in zone {zone}.",
}
# What the fake answers for a request whose validUntil passed while it waited. The service's own
# wording for this was not found in a public source: the fake's words, the module must not need them.
EXPIRED = "The queued resource request expired before resources could be provisioned."
DEADLINE_EXCEEDED = 4
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"


class ApiError(Exception):
    """An HTTP error in the JSON shape Google's gRPC-based APIs answer with over REST."""

    def __init__(self, status: int, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = {
            "error": {
                "code": status,
                "message": message,
                "status": STATUS.get(status, "UNKNOWN"),
                "details": details or [],
            }
        }


@dataclass
class Faults:
    """Faults and pacing. Times are seconds from the create."""

    op_delay: float = 0.0  # before an operation is done
    provision_delay: float = 0.0  # WAITING_FOR_RESOURCES/PROVISIONING before ACTIVE (or FAILED)
    stockout_zones: set[str] = field(default_factory=set)  # requests there FAIL for capacity
    waiting_zones: set[str] = field(default_factory=set)  # requests there wait for resources forever
    quota_zero: set[str] = field(default_factory=set)  # quota names whose limit is 0
    quota_at_create: bool = True  # True: the create answers 429; False: the request FAILS naming it
    # zone -> a NOT_OFFERED key: the zone offers none of the accelerator types (HTTP 400 / 404)
    not_offered: dict[str, str] = field(default_factory=dict)
    # zone -> google.rpc.Status the create operation finishes with (the request is left FAILED)
    create_op_error: dict[str, dict[str, Any]] = field(default_factory=dict)
    flex_start_zones: set[str] = field(default_factory=lambda: {"us-west4-a"})
    status_429: int = 0  # the next N requests answer 429 (throttling, no quota named)
    hostkeys_delay: float = 0.0  # seconds after a node is READY before worker 0 publishes host keys


def stamp(moment: datetime) -> str:
    """A google.protobuf.Timestamp in JSON, as the TPU API writes createTime: RFC 3339 in UTC with
    a Z (https://protobuf.dev/programming-guides/json/, Timestamp)."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _seconds(value: Any, where: str) -> int:
    match = re.fullmatch(r"(\d+)(?:\.\d+)?s", str(value))
    if not match:
        raise ApiError(400, f"Invalid value at '{where}' ({value}): a duration like \"3600s\"")
    return int(match.group(1))


class FakeTpu:
    """The API's state; every public method is called with ``lock`` held (server.py)."""

    def __init__(self, faults: Faults | None = None) -> None:
        self.faults = faults or Faults()
        # What time the API thinks it is: a test fixes it to check figures read from createTime.
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self.lock = threading.RLock()
        self.queued: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, id) -> resource
        self.nodes: dict[tuple[str, str], dict[str, Any]] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.requests_seen: dict[str, str] = {}  # requestId -> operation name
        self.log: list[dict[str, Any]] = []
        self.strict_errors: list[str] = []  # answers server.py refused to send (strict.py)
        self._ids = itertools.count(1)
        self._timeline: dict[tuple[str, str], dict[str, Any]] = {}
        # node id -> {key type: base64 blob} that worker 0's guest environment publishes under
        # hostkeys/ (tests replace a value to play a guest whose keys changed, or a hostile one).
        self.host_keys: dict[str, dict[str, str]] = {}
        self._ready_at: dict[str, float] = {}

    # ---- helpers --------------------------------------------------------------------------------
    def now(self) -> str:
        return stamp(self.clock())

    def requests(self, method: str, contains: str) -> list[dict[str, Any]]:
        return [r for r in self.log if r["method"] == method and contains in r["path"]]

    def _op(
        self,
        project: str,
        zone: str,
        target: str,
        verb: str,
        version: str,
        response: Any = None,
        error: dict[str, Any] | None = None,
    ) -> dict:
        name = f"projects/{project}/locations/{zone}/operations/operation-{int(time.time() * 1000)}-{next(self._ids)}"
        op = {
            "name": name,
            "metadata": {
                "@type": f"type.googleapis.com/google.cloud.tpu.{version}.OperationMetadata",
                "createTime": self.now(),
                "target": target,
                "verb": verb,
                "cancelRequested": False,
                "apiVersion": version,
            },
            "done": False,
        }
        self.ops[name] = {
            "op": op,
            "done_at": time.monotonic() + self.faults.op_delay,
            "response": response,
            "version": version,
            "error": error,
        }
        return json.loads(json.dumps(op))

    def get_operation(self, name: str, version: str) -> dict[str, Any]:
        entry = self.ops.get(name)
        if not entry or entry["version"] != version:  # operations.get of the version that made it
            raise ApiError(404, f"Operation {name} not found")
        op = entry["op"]
        if not op["done"] and time.monotonic() >= entry["done_at"]:
            op["done"] = True
            op["metadata"]["endTime"] = self.now()
            if entry["error"]:
                op["error"] = entry["error"]
            else:
                op["response"] = entry["response"] or {"@type": "type.googleapis.com/google.protobuf.Empty"}
        return json.loads(json.dumps(op))

    # ---- queued resources -------------------------------------------------------------------------
    def _check_zone(self, zone: str) -> None:
        if zone not in ZONES:
            raise ApiError(400, f"Invalid location: {zone} does not offer Cloud TPU v5e")

    def create_queued(self, project: str, zone: str, query: dict[str, str], body: dict[str, Any]) -> dict:
        self._check_zone(zone)
        request_id = query.get("requestId")
        if request_id and request_id in self.requests_seen:  # a retried create answers the first operation
            return self.get_operation(self.requests_seen[request_id], "v2alpha1")
        qr_id = query.get("queuedResourceId", "")
        if not _ID.match(qr_id):
            raise ApiError(400, f"Invalid queuedResourceId '{qr_id}': must match [a-z]([-a-z0-9]*[a-z0-9])?")
        body = dict(body)
        model = body.pop("provisioningModel", "PROVISIONING_MODEL_UNSPECIFIED")
        run = body.pop("runDuration", None)
        for output_only in ("name", "createTime", "state"):
            body.pop(output_only, None)
        from google.cloud import tpu_v2alpha1

        try:  # the released message types refuse unknown fields and bad enums, as the API does
            tpu_v2alpha1.QueuedResource.from_json(json.dumps(body), ignore_unknown_fields=False)
        except Exception as exc:
            raise ApiError(400, f"Invalid JSON payload received. {exc}") from exc
        if model not in PROVISIONING_MODELS:
            raise ApiError(400, f"Invalid value at 'queued_resource.provisioning_model' ({model})")
        specs = (body.get("tpu") or {}).get("nodeSpec") or []
        if len(specs) != 1:
            raise ApiError(400, "tpu.nodeSpec must hold exactly one node spec for a single node")
        spec = specs[0]
        parent = f"projects/{project}/locations/{zone}"
        if spec.get("parent") != parent:
            raise ApiError(
                400, f"nodeSpec.parent '{spec.get('parent')}' must be the request's parent '{parent}'"
            )
        node_id = spec.get("nodeId", "")
        if not _ID.match(node_id):
            raise ApiError(400, f"Invalid nodeSpec.nodeId '{node_id}'")
        node = spec.get("node") or {}
        accel, runtime = node.get("acceleratorType"), node.get("runtimeVersion")
        if not accel or not runtime:
            raise ApiError(400, "node.acceleratorType and node.runtimeVersion are required")
        email = (node.get("serviceAccount") or {}).get("email")
        if email and not (_SA_EMAIL.fullmatch(email) or email == DEFAULT_SA):
            raise ApiError(400, f"Invalid service account email '{email}'")
        wording = self.faults.not_offered.get(zone) or ("zonal" if accel not in ACCELERATOR_TYPES else "")
        if wording:
            raise ApiError(
                400 if wording == "zonal" else 404, NOT_OFFERED[wording].format(accel=accel, zone=zone)
            )
        if runtime not in RUNTIMES:
            raise ApiError(400, f"Runtime version {runtime} is not available in zone {zone}")
        tiers = [t for t in ("spot", "guaranteed", "bestEffort") if t in body]
        if len(tiers) > 1:
            raise ApiError(400, f"Only one tier may be set, got {', '.join(tiers)}")
        if run is not None and model != "FLEX_START":
            raise ApiError(400, "runDuration is only valid with the FLEX_START provisioning model")
        if model == "FLEX_START":
            if tiers or (node.get("schedulingConfig") or {}).get("spot"):
                raise ApiError(400, "FLEX_START cannot be combined with a tier or a spot node")
            seconds = _seconds(
                (run or {}).get("maxRunDuration"), "queued_resource.run_duration.max_run_duration"
            )
            if not 0 < seconds <= MAX_RUN_SECONDS:
                raise ApiError(400, f"maxRunDuration must be above 0 and at most 7 days, got {seconds}s")
            if zone not in self.faults.flex_start_zones:
                raise ApiError(
                    400,
                    f"FLEX_START provisioning model is not supported for accelerator type {accel} in zone {zone}.",
                )
        if (zone, qr_id) in self.queued:
            raise ApiError(409, f"Resource '{parent}/queuedResources/{qr_id}' already exists")
        spot = "spot" in body or bool((node.get("schedulingConfig") or {}).get("spot"))
        quota = QUOTA_SPOT if spot or model == "FLEX_START" else QUOTA
        if quota in self.faults.quota_zero and self.faults.quota_at_create:
            message = f"Quota limit '{quota}' has been exceeded. Limit: 0 in zone {zone}."
            raise ApiError(429, message, [{"@type": QUOTA_FAILURE,
                                           "violations": [{"subject": f"project:{project}", "description": message}]}])  # fmt: skip
        name = f"{parent}/queuedResources/{qr_id}"
        resource = dict(body, name=name, createTime=self.now(), state={"state": "CREATING"})
        if model != "PROVISIONING_MODEL_UNSPECIFIED":
            resource["provisioningModel"] = model
        if run is not None:
            resource["runDuration"] = {"maxRunDuration": f"{_seconds(run['maxRunDuration'], 'run')}s"}
        self.queued[(zone, qr_id)] = resource
        start = time.monotonic()
        self._timeline[(zone, qr_id)] = {
            "created": start + self.faults.op_delay,
            "decided": start + self.faults.op_delay + self.faults.provision_delay,
            "expires": start + self._lifetime(body.get("queueingPolicy") or {}),
            "project": project,
            "quota": quota,
        }
        response = dict(resource, **{"@type": "type.googleapis.com/google.cloud.tpu.v2alpha1.QueuedResource"})
        op_error = self.faults.create_op_error.get(zone)
        if op_error:  # the create fails as an operation; the request stays, FAILED with the same error
            resource["state"] = {
                "state": "FAILED",
                "failedData": {"error": op_error},
                "stateInitiator": "SERVICE",
            }
            self._timeline.pop((zone, qr_id))
        op = self._op(project, zone, name, "create", "v2alpha1", response, op_error)
        if request_id:
            self.requests_seen[request_id] = op["name"]
        return op

    @staticmethod
    def _lifetime(policy: dict[str, Any]) -> float:
        """Seconds from the create until a waiting request expires (validUntil), inf without one."""
        if "validUntilDuration" in policy:
            return float(
                _seconds(policy["validUntilDuration"], "queued_resource.queueing_policy.valid_until_duration")
            )
        if "validUntilTime" in policy:
            until = datetime.fromisoformat(str(policy["validUntilTime"]).replace("Z", "+00:00"))
            return (until - datetime.now(UTC)).total_seconds()
        return float("inf")

    def _advance(self, zone: str, qr_id: str) -> None:
        """Move a queued resource along its timeline (reads see the service's progress)."""
        qr, line = self.queued[(zone, qr_id)], self._timeline.get((zone, qr_id))
        state = qr["state"]["state"]
        if line is not None and state == "DELETING" and time.monotonic() >= line.get("gone", float("inf")):
            del self.queued[(zone, qr_id)]
            self.nodes.pop((zone, qr["tpu"]["nodeSpec"][0]["nodeId"]), None)
            return
        if line is None or state not in ("CREATING", "WAITING_FOR_RESOURCES", "PROVISIONING"):
            return
        now = time.monotonic()
        if now >= line["expires"] and now >= line["created"]:  # still waiting when validUntil passed
            qr["state"] = {"state": "FAILED", "failedData": {"error": {"code": DEADLINE_EXCEEDED, "message": EXPIRED}},
                           "stateInitiator": "SERVICE"}  # fmt: skip
            return
        if now < line["created"]:
            return
        if zone in self.faults.waiting_zones or now < line["decided"]:
            qr["state"] = {"state": "WAITING_FOR_RESOURCES", "acceptedData": {}}
            return
        if zone in self.faults.stockout_zones:
            qr["state"] = {"state": "FAILED", "failedData": {"error": {"code": 8, "message": CAPACITY.format(zone=zone)}},
                           "stateInitiator": "SERVICE"}  # fmt: skip
            return
        if line["quota"] in self.faults.quota_zero:  # quota checked when provisioning (quota_at_create=False)
            message = f"Quota limit '{line['quota']}' has been exceeded. Limit: 0 in zone {zone}."
            qr["state"] = {"state": "FAILED", "failedData": {"error": {"code": 8, "message": message}},
                           "stateInitiator": "SERVICE"}  # fmt: skip
            return
        qr["state"] = {"state": "ACTIVE", "activeData": {}}
        spec = qr["tpu"]["nodeSpec"][0]
        self.nodes[(zone, spec["nodeId"])] = self._node(line["project"], zone, spec, qr)

    def _node(self, project: str, zone: str, spec: dict[str, Any], qr: dict[str, Any]) -> dict[str, Any]:
        """A READY node with every field the API fills in, whether or not it was asked for."""
        asked = spec["node"]
        n = next(self._ids)
        network = (asked.get("networkConfig") or {}).get("network") or "default"
        external = (asked.get("networkConfig") or {}).get("enableExternalIps", False)
        endpoint: dict[str, Any] = {"ipAddress": f"10.182.0.{n % 250 + 2}", "port": 8470}
        if external:
            endpoint["accessConfig"] = {"externalIp": f"34.125.{n // 250}.{n % 250 + 2}"}
        sched = dict(asked.get("schedulingConfig") or {})
        if "spot" in qr:
            sched["spot"] = True
        node = dict(
            asked,
            name=f"projects/{project}/locations/{zone}/nodes/{spec['nodeId']}",
            state="READY",
            health="HEALTHY",
            id=str(8000000000000000000 + uuid.uuid4().int % 10**18),  # unique across fakes, as the API's
            createTime=self.now(),
            apiVersion="V2",
            cidrBlock="10.182.0.0/20",
            networkConfig={
                "network": f"projects/{project}/global/networks/{network.rsplit('/', 1)[-1]}",
                "subnetwork": f"projects/{project}/regions/{zone.rsplit('-', 1)[0]}/subnetworks/default",
                "enableExternalIps": bool(external),
            },
            # The reference: an empty email is the default Compute account, an empty scope every Cloud API.
            serviceAccount={
                "email": (asked.get("serviceAccount") or {}).get("email") or DEFAULT_SA,
                "scope": list((asked.get("serviceAccount") or {}).get("scope") or [CLOUD_PLATFORM]),
            },
            schedulingConfig=sched,
            networkEndpoints=[endpoint],
            acceleratorConfig={"type": "V5LITE_POD", "topology": "1x1"},
            queuedResource=f"projects/{PROJECT_NUMBER}/locations/{zone}/queuedResources/{qr['name'].rsplit('/', 1)[-1]}",
        )
        from tests.fake_compute.state import new_host_keys

        self.host_keys[node["id"]] = new_host_keys()
        self._ready_at[node["id"]] = time.monotonic()
        return node

    def get_guest_attributes(self, version: str, zone: str, node_id: str, body: dict[str, Any]) -> dict:
        """nodes.getGuestAttributes: per worker, what its guest wrote under queryPath (v2 and v2alpha1).

        The node must exist; a worker that has not written the path yet has no entry for it (404).
        """
        node = self.get_node(zone, node_id)
        from google.cloud import tpu_v2

        try:  # strict as the API: unknown fields refused
            request = tpu_v2.GetGuestAttributesRequest.from_json(
                json.dumps(body), ignore_unknown_fields=False
            )
        except Exception as exc:
            raise ApiError(400, f"Invalid JSON payload received. {exc}") from exc
        workers = list(request.worker_ids) or ["0"]
        if any(w != "0" for w in workers):  # a v5litepod-1 node has one worker
            raise ApiError(400, f"Invalid worker ids {workers}: node {node_id} has worker 0 only")
        path = request.query_path.lstrip("/")
        published = node["state"] == "READY" and time.monotonic() >= (
            self._ready_at.get(node["id"], float("inf")) + self.faults.hostkeys_delay
        )
        items = [
            {"namespace": "hostkeys", "key": kind, "value": value}
            for kind, value in sorted(self.host_keys.get(node["id"], {}).items())
            if f"hostkeys/{kind}".startswith(path)
        ]
        if not published or not items:
            raise ApiError(404, f"Guest attributes {request.query_path} not found for node {node_id}")
        answer = tpu_v2.GetGuestAttributesResponse(
            guest_attributes=[
                tpu_v2.GuestAttributes(
                    query_path=request.query_path, query_value=tpu_v2.GuestAttributesValue(items=items)
                )
            ]
        )
        return json.loads(tpu_v2.GetGuestAttributesResponse.to_json(answer))

    def get_queued(self, zone: str, qr_id: str) -> dict[str, Any]:
        if (zone, qr_id) in self.queued:
            self._advance(zone, qr_id)
        if (zone, qr_id) not in self.queued:
            raise ApiError(404, f"Resource 'queuedResources/{qr_id}' was not found in {zone}")
        return json.loads(json.dumps(self.queued[(zone, qr_id)]))

    def delete_queued(self, project: str, zone: str, qr_id: str, query: dict[str, str]) -> dict[str, Any]:
        qr = self.get_queued(zone, qr_id)
        if qr["state"]["state"] == "DELETING":
            raise ApiError(412, f"Queued resource {qr_id} is already being deleted")
        node_id = qr["tpu"]["nodeSpec"][0]["nodeId"]
        if (zone, node_id) in self.nodes:
            if query.get("force") != "true":
                raise ApiError(400, f"Queued resource {qr_id} has a node; delete it first or pass force=true")
            del self.nodes[(zone, node_id)]
        del self.queued[(zone, qr_id)]
        return self._op(project, zone, qr["name"], "delete", "v2alpha1")

    # ---- nodes ------------------------------------------------------------------------------------
    def get_node(self, zone: str, node_id: str) -> dict[str, Any]:
        for (z, qr_id), qr in list(self.queued.items()):
            if z == zone and qr["tpu"]["nodeSpec"][0]["nodeId"] == node_id:
                self._advance(z, qr_id)
        if (zone, node_id) not in self.nodes:
            raise ApiError(404, f"Resource 'projects/-/locations/{zone}/nodes/{node_id}' was not found")
        return json.loads(json.dumps(self.nodes[(zone, node_id)]))

    def delete_node(self, project: str, zone: str, node_id: str) -> dict[str, Any]:
        node = self.get_node(zone, node_id)
        owner = node.get("queuedResource", "").rsplit("/", 1)[-1]
        if owner and (zone, owner) in self.queued:
            raise ApiError(
                400, f"Node {node_id} is managed by queued resource {owner}: delete the queued resource"
            )
        del self.nodes[(zone, node_id)]
        return self._op(project, zone, node["name"], "delete", "v2")

    # ---- what the service does on its own ----------------------------------------------------------
    def run_out(self, zone: str, qr_id: str) -> None:
        """Flex-start's run duration is over: the node is deleted, the request SUSPENDED."""
        qr = self.queued[(zone, qr_id)]
        self.nodes.pop((zone, qr["tpu"]["nodeSpec"][0]["nodeId"]), None)
        qr["state"] = {"state": "SUSPENDED", "suspendedData": {}, "stateInitiator": "SERVICE"}

    def start_deleting(self, zone: str, qr_id: str, seconds: float) -> None:
        """Someone else deletes the request: DELETING for ``seconds``, then gone with its node."""
        qr = self.queued[(zone, qr_id)]
        qr["state"] = {"state": "DELETING", "deletingData": {}, "stateInitiator": "USER"}
        self._timeline[(zone, qr_id)] = dict(
            self._timeline.get((zone, qr_id)) or {}, gone=time.monotonic() + seconds
        )

    def set_node_state(self, zone: str, node_id: str, state: str) -> None:
        """Put a node in any Node.State the service reports (UNKNOWN, STOPPED, REPAIRING...)."""
        self.nodes[(zone, node_id)]["state"] = state

    def preempt(self, zone: str, node_id: str) -> None:
        """A spot node is preempted: it stays, PREEMPTED, until deleted."""
        self.nodes[(zone, node_id)]["state"] = "PREEMPTED"
