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
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded", "rateLimitExceeded_quota"})
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_QUOTA_RE = re.compile(r"Quota '([A-Z0-9_]+)' exceeded")


class GceError(Exception):
    """A failure the module reports as is; ``kind`` is stockout, quota, operation or api."""

    def __init__(self, kind: str, message: str, code: str = "", quota: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.quota = quota


def quota_name(message: str, details: list[dict[str, Any]] | None = None) -> str:
    """The quota metric an error names (NVIDIA_T4_GPUS...), from quotaInfo or the message."""
    for detail in details or []:
        info = detail.get("quotaInfo") or detail.get("quota_info") or {}
        limit = info.get("limitName") or info.get("limit_name") or ""
        if limit:
            return limit.split("-per-")[0].upper()
    match = _QUOTA_RE.search(message or "")
    return match.group(1) if match else "unknown quota"


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


def classify_exception(exc: Exception) -> str:
    """One of stockout, quota, retryable, notfound, fatal for a request exception."""
    status = getattr(exc, "code", None)
    message = str(getattr(exc, "message", "") or exc)
    reasons = _exception_reasons(exc)
    if any(r in STOCKOUT_CODES for r in reasons) or any(c in message for c in STOCKOUT_CODES):
        return "stockout"
    if any(r in QUOTA_CODES for r in reasons) or (status == 403 and _QUOTA_RE.search(message)):
        return "quota"
    if status == 404:
        return "notfound"
    if status in RETRYABLE_STATUS:
        return "retryable"
    return "fatal"


def exception_to_error(exc: Exception, project: str) -> GceError:
    """A GceError for a request exception that is not retried."""
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
