"""Wait for Compute operations through clients built with the module's own endpoint and credentials.

The extended-operation object ``insert()`` returns polls through a client without the endpoint
override, so the module calls ``*_unary`` methods and waits here with ``ZoneOperationsClient.wait``
(or the global one), each call of which returns when the operation is DONE or after about two
minutes, whichever comes first.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.module_utils.gce_client import to_dict
from ansible.module_utils.gce_errors import GceError, operation_error


def wait(clients: Any, op: Any, project: str, zone: str | None, timeout: float, retry: Any) -> dict[str, Any]:
    """Wait until ``op`` is DONE; returns it as a dict, raises GceError on its error or a timeout."""
    result = to_dict(op)
    deadline = time.monotonic() + timeout
    while result.get("status") != "DONE":
        if time.monotonic() > deadline:
            raise GceError("timeout", f"operation {result.get('name')} not done after {timeout:.0f}s")
        if zone:
            op = clients.zone_operations.wait(
                project=project, zone=zone, operation=result["name"], retry=retry
            )
        else:
            op = clients.global_operations.wait(project=project, operation=result["name"], retry=retry)
        result = to_dict(op)
    error = operation_error(result, project)
    if error:
        raise error
    return result
