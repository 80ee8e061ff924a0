"""Retry policy for Compute API calls: 429 and 5xx with exponential backoff, never a stockout.

The client retries reads itself but not inserts, and nothing retries 429 by default. Every call the
module makes goes through this policy; inserts carry a requestId so a retried insert that had in
fact gone through is answered with the first operation instead of creating a second VM.
"""

from __future__ import annotations

from ansible.module_utils.gce_errors import classify_exception

try:
    from google.api_core.retry import Retry
except ImportError:  # reported by the module through missing_required_lib
    Retry = None  # type: ignore[assignment,misc]


def is_retryable(exc: Exception) -> bool:
    """True for throttling and server errors, except a stockout (moving zones is the cure)."""
    return classify_exception(exc) == "retryable"


def make_retry(initial: float = 1.0, maximum: float = 30.0, deadline: float = 120.0) -> Retry:
    """A Retry with exponential backoff (x2, jittered by google.api_core) within ``deadline`` seconds."""
    return Retry(predicate=is_retryable, initial=initial, maximum=maximum, multiplier=2.0, timeout=deadline)
