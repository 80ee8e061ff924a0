"""Wait for Compute operations through clients built with the module's own endpoint and credentials.

The extended-operation object ``insert()`` returns polls through a client without the endpoint
override, so the module calls ``*_unary`` methods and waits here with ``ZoneOperationsClient.wait``
(or the global one), each call of which returns when the operation is DONE or after about two
minutes, whichever comes first. ``get_or_none`` and ``call_and_wait`` are the read and the write
every module makes, with the same error translation.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.module_utils.gce_client import to_dict
from ansible.module_utils.gce_errors import GceError, classify_exception, exception_to_error, operation_error

# Kinds of GceError a finished operation's own error becomes (gce_errors.operation_error).
OPERATION_ERROR_KINDS = frozenset({"stockout", "quota", "operation"})
_CALL_TIMEOUTS = ("ReadTimeout", "Timeout", "DeadlineExceeded", "GatewayTimeout")


def wait(clients: Any, op: Any, project: str, zone: str | None, timeout: float, retry: Any) -> dict[str, Any]:
    """Wait until ``op`` is DONE; returns it as a dict, raises GceError on its error or a timeout.

    The API's ``wait`` holds a request up to about two minutes; each call here is cut to the time
    left, so ``timeout`` is kept even when one wait would outlast it.
    """
    result = to_dict(op)
    deadline = time.monotonic() + timeout

    def timed_out() -> GceError:
        return GceError(
            "timeout",
            f"operation {result.get('name')} ({result.get('operationType')}) was still "
            f"{result.get('status')} after operation_timeout={timeout:g}s",
        )

    while result.get("status") != "DONE":
        left = deadline - time.monotonic()
        if left <= 0:
            raise timed_out()
        try:
            if zone:
                op = clients.zone_operations.wait(
                    project=project, zone=zone, operation=result["name"], retry=retry, timeout=left + 1.0
                )
            else:
                op = clients.global_operations.wait(
                    project=project, operation=result["name"], retry=retry, timeout=left + 1.0
                )
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            if time.monotonic() >= deadline and any(type(e).__name__ in _CALL_TIMEOUTS for e in (exc, cause)):
                raise timed_out() from exc
            raise exception_to_error(exc, project) from exc
        result = to_dict(op)
    error = operation_error(result, project)
    if error:
        raise error
    return result


def get_or_none(call: Any, project: str, retry: Any, /, **kwargs: Any) -> dict[str, Any] | None:
    """``call(project=project, **kwargs)`` as a dict, None when the resource does not exist."""
    try:
        return to_dict(call(project=project, retry=retry, **kwargs))
    except Exception as exc:
        if classify_exception(exc) == "notfound":
            return None
        raise exception_to_error(exc, project) from exc


def start(call: Any, project: str, retry: Any, /, **kwargs: Any) -> Any:
    """Send a changing request with ``call(**kwargs)`` (project added unless a ``request`` is
    given); returns the operation the API accepted, raises GceError when it was refused."""
    try:
        if "request" not in kwargs:
            kwargs["project"] = project
        return call(retry=retry, **kwargs)
    except GceError:
        raise
    except Exception as exc:
        raise exception_to_error(exc, project) from exc


def call_and_wait(
    clients: Any, call: Any, project: str, op_zone: str | None, timeout: float, retry: Any, /, **kwargs: Any
) -> dict[str, Any]:
    """Start an operation with ``call(**kwargs)`` and wait for it."""
    op = start(call, project, retry, **kwargs)
    return wait(clients, op, project, op_zone, timeout, retry)
