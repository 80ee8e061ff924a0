"""Classify Compute Engine errors: zone stockout, quota, retryable, or fatal.

Errors reach the module two ways: as a google.api_core exception from a request (sync), or as the
``error.errors`` list of a finished operation. A stockout and a transient 503 both arrive as
``ServiceUnavailable``, so the error code or reason decides, never the HTTP status alone.
"""

from __future__ import annotations

import re
from typing import Any

# Codes seen for "this zone has no capacity for this shape right now".
STOCKOUT_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "STOCKOUT",
        "resourcePoolExhausted",
    }
)
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
# Throttling: HTTP 429, or a 403 whose reason says a request rate limit was hit (not a resource quota).
THROTTLE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_QUOTA_RE = re.compile(r"Quota '([A-Za-z0-9_]+)' exceeded")
# Transport failures where the request may or may not have been done (the reply was lost). Every
# changing call carries a requestId, so sending it again is safe.
_CONNECTION_ERRORS = ("ConnectionError", "ChunkedEncodingError", "RemoteDisconnected", "ProtocolError")


class GceError(Exception):
    """A failure the module reports as is; ``kind`` is stockout, quota, operation or api."""

    def __init__(self, kind: str, message: str, code: str = "", quota: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.quota = quota
        self.names_state = False  # the message already says where the VM stands


def quota_name(message: str, details: list[dict[str, Any]] | None = None) -> str:
    """The quota an error names, spelled as the API spells it in messages and the console's
    quota page (``NVIDIA_T4_GPUS``, ``PREEMPTIBLE_NVIDIA_T4_GPUS``).

    The message's ``Quota 'NAME' exceeded`` wins; else quotaInfo's metricName
    (``compute.googleapis.com/nvidia_t4_gpus``); else its limitName
    (``NVIDIA-T4-GPUS-per-project-region``) with dashes read as underscores.
    """
    match = _QUOTA_RE.search(message or "")
    if match:
        return match.group(1).upper()
    for detail in details or []:
        info = detail.get("quotaInfo") or detail.get("quota_info") or {}
        metric = info.get("metricName") or info.get("metric_name") or ""
        if metric:
            return metric.rsplit("/", 1)[-1].upper()
        limit = info.get("limitName") or info.get("limit_name") or ""
        if limit:
            return limit.split("-per-")[0].replace("-", "_").upper()
    return "unknown quota"


def quota_advice(quota: str, project: str) -> str:
    """How to raise a quota, with the spot/standard caveat for T4 GPUs."""
    spot = " (spot VMs count against PREEMPTIBLE_NVIDIA_T4_GPUS, standard ones against NVIDIA_T4_GPUS)"
    return (
        f"Quota {quota} is exhausted{spot if 'T4' in quota else ''}. Raise it in the console "
        f"(IAM & Admin > Quotas, project {project}, filter on {quota}) and retry; "
        "a new project's GPU quota is 0, and an increase is usually granted within minutes to a day."
    )


def _exception_reasons(exc: Exception) -> list[str]:
    reasons = []
    for item in getattr(exc, "errors", None) or []:
        if isinstance(item, dict):
            reasons.append(str(item.get("reason", "")))
    reason = getattr(exc, "reason", None)
    if reason:
        reasons.append(str(reason))
    return reasons


def is_connection_error(exc: BaseException) -> bool:
    """A dropped connection or lost reply (requests/urllib3 errors, by name: no hard import)."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ in _CONNECTION_ERRORS:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_throttling(exc: BaseException) -> bool:
    """HTTP 429, or a rate-limit reason on another status."""
    return getattr(exc, "code", None) == 429 or any(r in THROTTLE_REASONS for r in _exception_reasons(exc))


def classify_exception(exc: Exception) -> str:
    """One of stockout, quota, retryable, notfound, fatal for a request exception."""
    status = getattr(exc, "code", None)
    message = str(getattr(exc, "message", "") or exc)
    reasons = _exception_reasons(exc)
    if any(r in STOCKOUT_CODES for r in reasons) or any(c in message for c in STOCKOUT_CODES):
        return "stockout"
    if is_throttling(exc):
        return "retryable"
    if any(r in QUOTA_CODES for r in reasons) or (status == 403 and _QUOTA_RE.search(message)):
        return "quota"
    if status == 404:
        return "notfound"
    if status in RETRYABLE_STATUS or (status is None and is_connection_error(exc)):
        return "retryable"
    return "fatal"


def exception_to_error(exc: Exception, project: str) -> GceError:
    """A GceError for a request exception that is not retried, or retried until the deadline."""
    if type(exc).__name__ == "RetryError":  # google.api_core: the retry deadline passed
        last = getattr(exc, "cause", None) or exc.__cause__
        if last is not None and is_throttling(last):
            return GceError(
                "throttled",
                "the Compute API kept throttling the requests (HTTP 429, rate limit exceeded) until "
                f"retry_deadline passed ({exc}); wait a minute, make fewer calls at once, or raise "
                f"retry_deadline. Last answer: {getattr(last, 'message', '') or last}",
                "rateLimitExceeded",
            )
        if last is not None and is_connection_error(last):
            return GceError(
                "api", f"the Compute API could not be reached until retry_deadline passed: {last}"
            )
        return GceError("api", f"the Compute API kept failing until retry_deadline passed ({exc}): {last}")
    kind = classify_exception(exc)
    message = str(getattr(exc, "message", "") or exc)
    if kind == "quota":
        quota = quota_name(message)
        return GceError("quota", f"{message} {quota_advice(quota, project)}", "quotaExceeded", quota)
    if kind == "stockout":
        return GceError("stockout", message, "ZONE_RESOURCE_POOL_EXHAUSTED")
    return GceError("api", f"Compute API error {getattr(exc, 'code', '')}: {message}")


def operation_error(op: dict[str, Any], project: str) -> GceError | None:
    """A GceError for a finished operation (REST JSON dict) that carries an error, else None."""
    errors = (op.get("error") or {}).get("errors") or []
    if not errors:
        return None
    first = errors[0]
    code = str(first.get("code", ""))
    message = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
    if code in STOCKOUT_CODES:
        return GceError("stockout", message, code)
    if code in QUOTA_CODES:
        quota = quota_name(first.get("message", ""), first.get("errorDetails"))
        return GceError("quota", f"{message} {quota_advice(quota, project)}", code, quota)
    return GceError(
        "operation", f"operation {op.get('name')} ({op.get('operationType')}) failed: {message}", code
    )
