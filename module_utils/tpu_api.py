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

# Quotas the Cloud TPU API counts a v5e chip against (Quotas page of the console, Cloud TPU API).
QUOTA_V5E = "TPUV5sLitepodPerProjectPerZoneForTPUAPI"  # on-demand and flex-start
QUOTA_V5E_SPOT = "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"  # spot
# Queued-resource states: still on its way, done, or over (the node is gone or never came).
QR_WAITING = frozenset({"CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING"})
QR_TERMINAL = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})
# Node states after which it will not serve again without a new node.
NODE_GONE = frozenset({"PREEMPTED", "TERMINATED", "DELETING"})
# gRPC code 8; the TPU API's stockout wording ("There is no more capacity in the zone ...").
RESOURCE_EXHAUSTED = 8
_CAPACITY = re.compile(r"no more capacity|out of capacity|insufficient capacity|stockout", re.I)
_QUOTA = re.compile(
    r"Quota (?:limit )?'([A-Za-z0-9_]+)'|\b(TPU[A-Za-z0-9]*(?:PerProject|ForTPUAPI)[A-Za-z0-9]*)\b"
)
_UNSUPPORTED = re.compile(r"not supported|is not available in zone|not offered", re.I)


def quota_for(provisioning_model: str) -> str:
    """The quota a v5e request counts against: spot has its own (preemptible) one."""
    return QUOTA_V5E_SPOT if provisioning_model == "spot" else QUOTA_V5E


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


def is_quota_exception(exc: BaseException) -> bool:
    """RESOURCE_EXHAUSTED that names a quota (HTTP 429 is also plain throttling, which is retried)."""
    message = str(getattr(exc, "message", "") or exc)
    status = getattr(exc, "grpc_status_code", None)
    exhausted = getattr(status, "name", "") == "RESOURCE_EXHAUSTED" or getattr(exc, "code", None) == 429
    return exhausted and bool(_QUOTA.search(message)) and "rate" not in message.lower()


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
        self.wait(op["name"])

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
        self.wait(op.operation.name)

    def wait(self, op_name: str) -> None:
        """Poll a long-running operation until done; raise its error as a GceError.

        Read as JSON (v2 ``operations.get``): an operation's metadata is an ``Any`` of whichever API
        version started it, which the typed client would have to know to parse.
        """
        deadline = time.monotonic() + self.operation_timeout
        while True:
            try:
                op = self._raw("GET", op_name, version="v2")
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
        if error.get("code"):
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
    message = str(getattr(exc, "message", "") or exc)
    if is_quota_exception(exc):
        return quota_error(message, api.project, zone, fallback_quota)
    if getattr(exc, "code", None) == 400 and _UNSUPPORTED.search(message):
        return GceError("unsupported", message, "INVALID_ARGUMENT")
    if _CAPACITY.search(message):
        return GceError("stockout", message, "RESOURCE_EXHAUSTED")
    return exception_to_error(exc, api.project)


def failed_error(qr: dict[str, Any], api: Api, zone: str, fallback_quota: str) -> GceError:
    """What a FAILED queued resource's ``failedData.error`` means."""
    error = ((qr.get("state") or {}).get("failedData") or {}).get("error") or {}
    message = error.get("message") or json.dumps(qr.get("state") or {})
    if error.get("code") == RESOURCE_EXHAUSTED and _QUOTA.search(message):
        return quota_error(message, api.project, zone, fallback_quota)
    if _CAPACITY.search(message) or error.get("code") == RESOURCE_EXHAUSTED:
        return GceError("stockout", message, "RESOURCE_EXHAUSTED")
    return GceError(
        "operation", f"queued resource {qr.get('name')} FAILED: {message}", str(error.get("code", ""))
    )
