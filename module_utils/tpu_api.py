"""Talk to the Cloud TPU API for tpu_node: queued resources, nodes, operations, and their errors.

Two surfaces, one set of credentials and one endpoint (docs/tpu.md, "Which API"):

- Nodes go through the released client, ``google.cloud.tpu_v2``
  (``TpuClient``, REST transport), so an ``api_endpoint`` override reaches a local fake too.
- Queued resources go to the ``v2alpha1`` REST surface as JSON through an ``AuthorizedSession``
  with the same credentials: flex-start (a provisioning model and a run duration) exists only
  there, and google-cloud-tpu 1.28.0 has neither the fields nor a REST transport for v2alpha1.

Errors become ``GceError`` (module_utils/gce_errors.py; the kinds are the same for both clouds):
``stockout`` (no capacity in the zone: the module tries the next), ``unsupported`` (the zone does
not offer this provisioning model for the accelerator: also the next zone), ``quota`` (fails at
once, naming the quota), ``timeout``, ``operation`` and ``api``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.gce_client import credentials, to_dict
from ansible.module_utils.gce_errors import GceError, classify_exception, exception_to_error
from ansible.module_utils.vm_host_keys import QUERY_PATH

try:
    from google.api_core import exceptions as core_exceptions
    from google.api_core.client_options import ClientOptions
    from google.api_core.retry import Retry
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import tpu_v2

    HAS_TPU = True
    TPU_IMPORT_ERROR = None
except ImportError as exc:  # the module reports it with missing_required_lib
    HAS_TPU = False
    TPU_IMPORT_ERROR = exc

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
DEFAULT_ENDPOINT = "https://tpu.googleapis.com"
QR_API = "v2alpha1"

# The quota a v5e request counts against, per provisioning model, as the console's Quotas page
# (service Cloud TPU API) names it. Flex-start is charged to the preemptible quota: Google's
# flex-start page says to "ensure you have sufficient preemptible quota"
# (https://cloud.google.com/tpu/docs/request-using-flex-start). Reserved capacity has a quota of
# its own (https://cloud.google.com/tpu/docs/quota), which this module never asks for.
QUOTA_V5E = "TPUV5sLitepodPerProjectPerZoneForTPUAPI"
QUOTA_V5E_PREEMPTIBLE = "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"
QUOTAS = {
    "on-demand": QUOTA_V5E,
    "spot": QUOTA_V5E_PREEMPTIBLE,
    "flex-start": QUOTA_V5E_PREEMPTIBLE,
}
# Every QueuedResourceState.State of google-cloud-tpu 1.28.0 (tpu_v2alpha1), in one of four sets:
# on its way, serving, over (the node is gone or never came: delete and ask again), or going away.
QR_WAITING = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING"})
QR_TERMINAL = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})
QR_DELETING = "DELETING"
QR_STATES = QR_WAITING | QR_TERMINAL | {"ACTIVE", QR_DELETING, "STATE_UNSPECIFIED"}
# Every Node.State of tpu_v2: READY serves; these are on their way to READY (worth waiting for) ...
NODE_COMING = frozenset({"CREATING", "RESTARTING", "REIMAGING", "REPAIRING", "STARTING", "UNHIDING"})
# ... after these it will not serve again without a new node (replaced on the next run) ...
NODE_GONE = frozenset({"PREEMPTED", "TERMINATED", "DELETING"})
# ... and these need a person: stopped or hidden by someone, or a state the service does not know.
NODE_STUCK = frozenset({"STOPPED", "STOPPING", "HIDING", "HIDDEN", "UNKNOWN", "STATE_UNSPECIFIED"})
NODE_STATES = NODE_COMING | NODE_GONE | NODE_STUCK | {"READY"}
# gRPC codes in an operation's or a FAILED request's google.rpc.Status.
RESOURCE_EXHAUSTED = 8
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
THROTTLE_REASONS = frozenset({"RATE_LIMIT_EXCEEDED", "rateLimitExceeded", "userRateLimitExceeded"})
# The TPU API's stockout wording ("There is no more capacity in the zone ...").
_CAPACITY = re.compile(r"no more capacity|out of capacity|insufficient capacity|stockout", re.I)
_QUOTA = re.compile(
    r"Quota (?:limit )?'([A-Za-z0-9_]+)'|\b(TPU[A-Za-z0-9]*(?:PerProject|ForTPUAPI)[A-Za-z0-9]*)\b"
)
# "This zone does not offer it": the provisioning model for the accelerator, or the accelerator at
# all. The two accelerator wordings are the live API's as docs/tpu.md quotes them.
_UNSUPPORTED = re.compile(
    r"not supported|is not available in zone|not offered"
    r"|could not be found in the zonal accelerator configurations"
    r"|accelerator \S+ was not found in zone",
    re.I,
)


def quota_for(provisioning_model: str) -> str:
    """The quota a v5e request of this provisioning model counts against."""
    return QUOTAS[provisioning_model]


def quota_in(message: str, fallback: str) -> str:
    """The quota a message names, else ``fallback`` (the one this request counts against)."""
    match = _QUOTA.search(message or "")
    return (match.group(1) or match.group(2)) if match else fallback


def quota_error(message: str, project: str, zone: str, fallback: str) -> GceError:
    """A one-line quota failure naming the quota and where to raise it."""
    quota = quota_in(message, fallback)
    return GceError(
        "quota",
        f"Cloud TPU quota {quota} is exhausted in {zone} (project {project}): raise it in the console "
        f"(IAM & Admin > Quotas, service Cloud TPU API, filter on {quota}) and run again. API: {message}",
        "RESOURCE_EXHAUSTED",
        quota,
    )


def api_message(exc: BaseException) -> str:
    """The API's own ``error.message``: google.api_core puts the method and URL in front of it, and a
    URL holds the project and resource names, which must not be read as the error's words."""
    response = getattr(exc, "response", None)
    try:
        message = response.json()["error"]["message"] if response is not None else None
    except (ValueError, KeyError, TypeError, AttributeError):
        message = None
    return str(message if isinstance(message, str) else (getattr(exc, "message", "") or exc))


def _detail_types(details: Any) -> set[str]:
    return {str(d.get("@type", "")) for d in details or [] if isinstance(d, dict)}


def _reasons(details: Any) -> set[str]:
    return {
        str(d.get("reason", ""))
        for d in details or []
        if isinstance(d, dict) and d.get("@type") == ERROR_INFO
    }


def names_a_quota(message: str, details: Any) -> bool:
    """A resource quota, told by the structured details first: an ErrorInfo reason of a rate limit is
    throttling, a QuotaFailure is a quota; with neither, the quota wording of the API's message."""
    if _reasons(details) & THROTTLE_REASONS:
        return False
    return QUOTA_FAILURE in _detail_types(details) or bool(_QUOTA.search(message or ""))


def is_quota_exception(exc: BaseException) -> bool:
    """RESOURCE_EXHAUSTED that is a resource quota (HTTP 429 is also plain throttling, which is retried)."""
    status = getattr(exc, "grpc_status_code", None)
    exhausted = getattr(status, "name", "") == "RESOURCE_EXHAUSTED" or getattr(exc, "code", None) == 429
    return exhausted and names_a_quota(api_message(exc), getattr(exc, "details", None))


def is_retryable(exc: Exception) -> bool:
    """Throttling and server errors, never a quota (waiting does not raise a quota)."""
    return not is_quota_exception(exc) and classify_exception(exc) == "retryable"


def make_retry(initial: float, deadline: float) -> Any:
    """Exponential backoff within ``deadline`` seconds (x2, at most 30 s a wait)."""
    return Retry(predicate=is_retryable, initial=initial, maximum=30.0, multiplier=2.0, timeout=deadline)


def duration_seconds(text: str) -> int:
    """``4h``, ``90m``, ``3600s``, ``1d`` or a bare number of seconds, as seconds (ValueError if not)."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", str(text))
    if not match:
        raise ValueError(f"max_run_duration {text!r} is not a duration like 4h, 90m or 3600s")
    return int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


@dataclass
class Api:
    """The clients one module run uses, all with the same credentials and endpoint."""

    project: str
    nodes: Any  # tpu_v2.TpuClient (REST)
    session: Any  # AuthorizedSession for the v2alpha1 queued-resource calls
    base: str  # endpoint the session speaks to
    retry: Any
    operation_timeout: float
    poll_interval: float

    # ---- names -------------------------------------------------------------------------------
    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def qr_name(self, zone: str, name: str) -> str:
        return f"{self.parent(zone)}/queuedResources/{name}"

    def node_name(self, zone: str, name: str) -> str:
        return f"{self.parent(zone)}/nodes/{name}"

    # ---- raw v2alpha1 calls, with the client's retry and error classes --------------------------
    def _raw(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: Any = None,
        version: str = QR_API,
    ) -> Any:
        def once() -> Any:
            reply = self.session.request(
                method, f"{self.base}/{version}/{path}", params=params, json=body, timeout=60
            )
            if reply.status_code >= 400:
                raise core_exceptions.from_http_response(reply)
            return reply.json() if reply.content else {}

        return self.retry(once)()

    def get_qr(self, zone: str, name: str) -> dict[str, Any] | None:
        """The queued resource as the API returns it (JSON), None when it does not exist."""
        try:
            return self._raw("GET", self.qr_name(zone, name))
        except Exception as exc:
            if classify_exception(exc) == "notfound":
                return None
            raise exception_to_error(exc, self.project) from exc

    def create_qr(self, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send the create (requestId: a retried create is not a second request); returns the operation."""
        params = {"queuedResourceId": name, "requestId": str(uuid.uuid4())}
        return self._raw("POST", f"{self.parent(zone)}/queuedResources", params, body)

    def delete_qr(self, zone: str, name: str) -> None:
        """Delete the queued resource and, with force, the node it holds; wait for it."""
        try:
            op = self._raw(
                "DELETE", self.qr_name(zone, name), {"force": "true", "requestId": str(uuid.uuid4())}
            )
        except Exception as exc:
            if classify_exception(exc) == "notfound":
                return
            raise exception_to_error(exc, self.project) from exc
        self.wait_ok(op["name"], QR_API)

    # ---- nodes and operations through google-cloud-tpu -----------------------------------------
    def get_node(self, zone: str, name: str) -> dict[str, Any] | None:
        try:
            return to_dict(self.nodes.get_node(name=self.node_name(zone, name), retry=self.retry))
        except Exception as exc:
            if classify_exception(exc) == "notfound":
                return None
            raise exception_to_error(exc, self.project) from exc

    def guest_hostkeys(self, zone: str, name: str) -> list[dict[str, Any]] | None:
        """Worker 0's ``hostkeys/`` guest attribute entries (the worker SSH reaches); None while none."""
        request = tpu_v2.GetGuestAttributesRequest(
            name=self.node_name(zone, name), query_path=QUERY_PATH, worker_ids=["0"]
        )
        try:
            reply = to_dict(self.nodes.get_guest_attributes(request=request, retry=self.retry))
        except Exception as exc:
            if classify_exception(exc) == "notfound":
                return None
            raise exception_to_error(exc, self.project) from exc
        workers = reply.get("guestAttributes") or []
        return ((workers[0].get("queryValue") or {}).get("items") or []) if workers else None

    def delete_node(self, zone: str, name: str) -> None:
        try:
            op = self.nodes.delete_node(name=self.node_name(zone, name), retry=self.retry)
        except Exception as exc:
            if classify_exception(exc) == "notfound":
                return
            raise exception_to_error(exc, self.project) from exc
        self.wait_ok(op.operation.name, "v2")

    def wait(self, op_name: str, version: str) -> dict[str, Any] | None:
        """Poll a long-running operation until done; its ``error`` (a google.rpc.Status), None if none.

        Polled on the API version that started it (``operations.get`` of that version), and read as
        JSON: an operation's metadata is an ``Any`` of that version, which the typed v2 client would
        have to know to parse.
        """
        deadline = time.monotonic() + self.operation_timeout
        while True:
            try:
                op = self._raw("GET", op_name, version=version)
            except Exception as exc:
                raise exception_to_error(exc, self.project) from exc
            if op.get("done"):
                break
            if time.monotonic() >= deadline:
                raise GceError(
                    "timeout",
                    f"operation {op_name} was not done after operation_timeout={self.operation_timeout:g}s",
                )
            time.sleep(self.poll_interval)
        error = op.get("error") or {}
        return error if error.get("code") else None

    def wait_ok(self, op_name: str, version: str) -> None:
        """Wait for an operation that must succeed (a delete); its error fails the run."""
        error = self.wait(op_name, version)
        if error:
            raise GceError(
                "operation", f"operation {op_name} failed: {error.get('message')}", str(error["code"])
            )


def make_api(params: dict[str, Any]) -> Api:
    """Clients for one run from the module's parameters (credentials are read here, before any request)."""
    creds = credentials(params["auth_kind"], params["service_account_file"], SCOPES)
    endpoint = params.get("api_endpoint") or ""
    options = ClientOptions(api_endpoint=endpoint) if endpoint else None
    nodes = tpu_v2.TpuClient(credentials=creds, client_options=options, transport="rest")
    base = endpoint.rstrip("/") if endpoint else DEFAULT_ENDPOINT
    if "://" not in base:
        base = f"https://{base}"
    return Api(
        project=params["project"],
        nodes=nodes,
        session=AuthorizedSession(creds),
        base=base,
        retry=make_retry(params["retry_initial_delay"], params["retry_deadline"]),
        operation_timeout=float(params["operation_timeout"]),
        poll_interval=float(params["poll_interval"]),
    )


def create_error(exc: Exception, api: Api, zone: str, fallback_quota: str) -> GceError:
    """What a refused create means: quota (stop), unsupported in this zone (next zone), or an error."""
    if isinstance(exc, GceError):
        return exc
    message = api_message(exc)
    if is_quota_exception(exc):
        return quota_error(message, api.project, zone, fallback_quota)
    if getattr(exc, "code", None) in (400, 404) and _UNSUPPORTED.search(message):
        return GceError("unsupported", message, "INVALID_ARGUMENT")
    if _CAPACITY.search(message):
        return GceError("stockout", message, "RESOURCE_EXHAUSTED")
    return exception_to_error(exc, api.project)


def status_error(status: dict[str, Any], what: str, api: Api, zone: str, fallback_quota: str) -> GceError:
    """What a google.rpc.Status means, the same for a FAILED queued resource's ``failedData.error``
    and a create operation that finished with an error: quota, unsupported, stockout or operation."""
    message = str(status.get("message") or "")
    details, code = status.get("details"), status.get("code")
    if code == RESOURCE_EXHAUSTED and names_a_quota(message, details):
        return quota_error(message, api.project, zone, fallback_quota)
    if _UNSUPPORTED.search(message):
        return GceError("unsupported", message, str(code or ""))
    if _CAPACITY.search(message) or code == RESOURCE_EXHAUSTED:
        return GceError("stockout", message, "RESOURCE_EXHAUSTED")
    return GceError("operation", f"{what}: {message or json.dumps(status)}", str(code or ""))


def failed_error(qr: dict[str, Any], api: Api, zone: str, fallback_quota: str) -> GceError:
    """What a FAILED (or SUSPENDED...) queued resource's ``failedData.error`` means."""
    state = qr.get("state") or {}
    error = (state.get("failedData") or {}).get("error") or {}
    if not error:
        error = {"message": json.dumps(state)}
    return status_error(
        error, f"queued resource {qr.get('name')} {state.get('state')}", api, zone, fallback_quota
    )
