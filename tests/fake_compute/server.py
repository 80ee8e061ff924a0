"""HTTP front of the fake Compute API: routes the REST paths the client uses onto FakeCompute.

Run standalone for manual use: ``python -m tests.fake_compute --port 8089``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fake_compute import iam, strict
from tests.fake_compute.podman import PodmanBacking, parse_pairs
from tests.fake_compute.state import ApiError, DropConnection, FakeCompute, Faults

LOG = logging.getLogger(__name__)

# The fake's own control, no part of the API (and no token needed): what Compute Engine or a guest
# does to an instance on its own. POST /fake-admin/zones/Z/instances/N/preempt (or guestTerminate).
FAKE_ADMIN = re.compile(
    r"/fake-admin/zones/([a-z0-9-]{1,63})/instances/([a-z0-9-]{1,63})/(preempt|guestTerminate)"
)

_P = r"/compute/v1/projects/(?P<project>[^/]+)"
_Z = _P + r"/zones/(?P<zone>[^/]+)"
# (method, path regex, handler name); first match wins.
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p + "$"), h)
    # IAM policies first: instance_action's pattern would take setIamPolicy (tests/fake_compute/iam.py).
    for m, p, h in [
        *iam.ROUTES,
        ("GET", _Z + r"/instances/(?P<name>[^/]+)", "get_instance"),
        ("GET", _Z + r"/instances/(?P<name>[^/]+)/getGuestAttributes", "get_guest_attributes"),
        ("GET", _Z + r"/instances", "list_instances"),
        ("POST", _Z + r"/instances", "insert_instance"),
        ("DELETE", _Z + r"/instances/(?P<name>[^/]+)", "delete_instance"),
        ("POST", _Z + r"/instances/(?P<name>[^/]+)/(?P<verb>[A-Za-z]+)", "instance_action"),
        ("GET", _Z + r"/disks/(?P<name>[^/]+)", "get_disk"),
        ("DELETE", _Z + r"/disks/(?P<name>[^/]+)", "delete_disk"),
        ("GET", _Z + r"/operations", "list_operations"),
        ("GET", _Z + r"/operations/(?P<name>[^/]+)", "get_operation"),
        ("POST", _Z + r"/operations/(?P<name>[^/]+)/wait", "wait_operation"),
        ("GET", _P + r"/global/operations/(?P<name>[^/]+)", "get_operation"),
        ("POST", _P + r"/global/operations/(?P<name>[^/]+)/wait", "wait_operation"),
        ("GET", _P + r"/global/firewalls/(?P<name>[^/]+)", "get_firewall"),
        ("POST", _P + r"/global/firewalls", "insert_firewall"),
        ("PATCH", _P + r"/global/firewalls/(?P<name>[^/]+)", "patch_firewall"),
        ("PUT", _P + r"/global/firewalls/(?P<name>[^/]+)", "update_firewall"),
        ("DELETE", _P + r"/global/firewalls/(?P<name>[^/]+)", "delete_firewall"),
    ]
]


MUTATING = frozenset(
    {"insert_instance", "delete_instance", "instance_action", "delete_disk", "insert_firewall",
     "patch_firewall", "update_firewall", "delete_firewall"}
)  # fmt: skip


# The IAM permission each route needs (an instance action: compute.instances.<verb>), from the
# Compute Engine IAM reference (https://cloud.google.com/compute/docs/reference/rest/v1/instances/start
# and its sibling pages list "Requires ... IAM permission").
PERMISSIONS = {
    "get_instance": "compute.instances.get",
    "get_guest_attributes": "compute.instances.getGuestAttributes",
    "list_instances": "compute.instances.list",
    "insert_instance": "compute.instances.create",
    "delete_instance": "compute.instances.delete",
    "list_operations": "compute.zoneOperations.list",
    "get_disk": "compute.disks.get",
    "delete_disk": "compute.disks.delete",
    "get_firewall": "compute.firewalls.get",
    "insert_firewall": "compute.firewalls.create",
    "patch_firewall": "compute.firewalls.update",
    "update_firewall": "compute.firewalls.update",
    "delete_firewall": "compute.firewalls.delete",
    **iam.PERMISSIONS,
}


def required(method: str, path: str, body: dict[str, Any]) -> tuple[str, str] | None:
    """(permission, resource) a request needs, as the API names them; None when no route matches."""
    for route_method, pattern, handler in ROUTES:
        match = route_method == method and pattern.match(path)
        if not match:
            continue
        a = match.groupdict()
        resource = path.removeprefix("/compute/v1/")
        if handler in ("get_operation", "wait_operation"):
            scope = "zoneOperations" if a.get("zone") else "globalOperations"
            return f"compute.{scope}.get", resource.removesuffix("/wait")
        if handler == "instance_action":
            return f"compute.instances.{a['verb']}", resource.rsplit("/", 1)[0]
        if handler in ("insert_instance", "insert_firewall"):
            resource += "/" + str(body.get("name", ""))
        if handler in ("get_guest_attributes", "get_instance_iam_policy", "set_instance_iam_policy"):
            resource = resource.rsplit("/", 1)[0]
        if handler in ("get_project_iam_policy", "set_project_iam_policy"):
            resource = f"projects/{a['project']}"
        return PERMISSIONS[handler], resource
    return None


def authorize(
    permissions: dict[str, set[str]],
    authorization: str,
    need: tuple[str, str] | None,
    api: FakeCompute | None = None,
) -> None:
    """Raise the API's 401 for a missing or unknown token, its 403 for a permission the token lacks.

    A token that acts as a service account (iam.act_as) holds what the policies on the resource
    and its project grant that account; any other token, what ``permissions`` lists for it.
    """
    scheme, _, token = authorization.partition(" ")
    email = iam.of(api).identity(token) if api is not None and scheme.lower() == "bearer" else None
    if email is not None:
        if need is not None and not iam.of(api).allows(email, *need):  # type: ignore[arg-type]
            raise ApiError(403, f"Required '{need[0]}' permission for '{need[1]}'", "forbidden")
        return
    if scheme.lower() != "bearer" or token not in permissions:
        raise ApiError(
            401,
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
            "cookie or other valid authentication credential. See "
            "https://developers.google.com/identity/sign-in/web/devconsole-project.",
            "authError",
        )
    if need is not None and need[0] not in permissions[token]:
        raise ApiError(403, f"Required '{need[0]}' permission for '{need[1]}'", "forbidden")


def route(method: str, path: str) -> str | None:
    """The handler a request goes to, None when the fake has no route for it."""
    return next((h for m, pattern, h in ROUTES if m == method and pattern.match(path)), None)


def dispatch(api: FakeCompute, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
    """Route one request; returns the JSON answer or raises ApiError (or DropConnection)."""
    for route_method, pattern, handler in ROUTES:
        match = route_method == method and pattern.match(path)
        if not match:
            continue
        a = match.groupdict()
        if handler == "wait_operation":
            return api.wait_operation(a["name"], _op_scope(a))  # outside the lock: it polls
        with api.lock:
            request_id = query.get("requestId") if handler in MUTATING else None
            replay = api.replayed(request_id)
            if replay is not None:  # the API answers a repeated requestId with the first operation
                return replay
            if handler in iam.HANDLERS:
                return iam.handle(api, handler, a, query, body)
            if handler == "get_guest_attributes":
                return api.get_guest_attributes(a["project"], a["zone"], a["name"], query)
            if handler == "list_operations":
                return api.list_operations(a["project"], a["zone"], query)
            answer = _call(api, handler, a, body)
            api.remember(request_id, answer)
            if handler == "insert_instance":
                faults = api.faults
                if faults.insert_503_after:
                    faults.insert_503_after -= 1
                    raise ApiError(503, "The service is currently unavailable.", "backendError")
                if faults.insert_drop_after:
                    faults.insert_drop_after -= 1
                    raise DropConnection
            return answer
    raise ApiError(404, f"The fake has no route for {method} {path}", "notFound")


def _call(api: FakeCompute, handler: str, a: dict[str, str], body: dict[str, Any]) -> Any:
    if handler == "insert_instance":
        return api.insert_instance(a["project"], a["zone"], body)
    if handler in ("get_instance", "get_disk"):
        return getattr(api, handler)(a["zone"], a["name"], a["project"])
    if handler == "list_instances":
        return api.list_instances(a["zone"])
    if handler in ("delete_instance", "delete_disk"):
        return getattr(api, handler)(a["project"], a["zone"], a["name"])
    if handler == "instance_action":
        return api.instance_action(a["project"], a["zone"], a["name"], a["verb"], body)
    if handler == "get_operation":
        return api.get_operation(a["name"], _op_scope(a))
    if handler == "get_firewall":
        return api.get_firewall(a["name"], a["project"])
    if handler == "insert_firewall":
        return api.insert_firewall(a["project"], body)
    if handler == "patch_firewall":
        return api.patch_firewall(a["project"], a["name"], body)
    if handler == "update_firewall":
        return api.update_firewall(a["project"], a["name"], body)
    return api.delete_firewall(a["project"], a["name"])


def _op_scope(a: dict[str, str]) -> str:
    """projects/P/zones/Z for a zonal operation, projects/P/global for a global one."""
    zone = a.get("zone")
    return f"projects/{a['project']}/" + (f"zones/{zone}" if zone else "global")


class _Handler(BaseHTTPRequestHandler):
    api: FakeCompute  # set on the subclass made per server
    # token -> the IAM permissions it carries; None: every request is allowed (no auth at all)
    permissions: dict[str, set[str]] | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log below replaces the default stderr chatter

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw.strip() else {}
        self.api.log.append({"method": self.command, "path": parts.path, "query": query, "body": body})
        if parts.path.startswith("/fake-admin/"):
            self._admin(parts.path)
            return
        try:
            if self.permissions is not None:
                need = required(self.command, parts.path, body if isinstance(body, dict) else {})
                authorize(self.permissions, self.headers.get("Authorization", ""), need, self.api)
            with self.api.lock:
                if self.api.faults.status_429 and parts.path.endswith(self.api.faults.status_429_suffix):
                    self.api.faults.status_429 -= 1
                    raise ApiError(429, "Rate Limit Exceeded", "rateLimitExceeded")
            status, answer = 200, dispatch(self.api, self.command, parts.path, query, body)
        except ApiError as err:
            status, answer = err.status, err.body
        except DropConnection:
            self.close_connection = True  # the work is done; the caller never hears of it
            return
        try:
            strict.check(route(self.command, parts.path), status, answer)
        except strict.ResponseMismatch as exc:
            # The client would have ignored the field: fail here instead, naming it.
            LOG.error("fake Compute answer to %s %s is not the API's: %s", self.command, parts.path, exc)
            with self.api.lock:
                self.api.mismatches.append(str(exc))
            status, answer = (
                500,
                ApiError(500, f"The fake's answer is not the API's: {exc}", "backendError").body,
            )
        self._send_json(status, answer)

    def _admin(self, path: str) -> None:
        """The fake's control route: the instance as it is after the event, or the API's error shape."""
        match = FAKE_ADMIN.fullmatch(path) if self.command == "POST" else None
        try:
            if match is None:
                raise ApiError(404, f"The fake has no control route {self.command} {path}", "notFound")
            zone, name, event = match.groups()
            with self.api.lock:
                act = self.api.preempt if event == "preempt" else self.api.guest_terminate
                status, answer = 200, act(zone, name)
        except ApiError as err:
            status, answer = err.status, err.body
        self._send_json(status, answer)

    def _send_json(self, status: int, answer: Any) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle


class FakeComputeServer:
    """The fake on 127.0.0.1 with an ephemeral port, served from a daemon thread.

    Use as a context manager; ``endpoint`` is what the module's ``api_endpoint`` takes.
    """

    def __init__(
        self, faults: Faults | None = None, port: int = 0, permissions: dict[str, set[str]] | None = None
    ) -> None:
        self.api = FakeCompute(faults)
        handler = type("Handler", (_Handler,), {"api": self.api, "permissions": permissions})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeComputeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FakeComputeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """Serve the fake in the foreground until interrupted."""
    parser = argparse.ArgumentParser(description="Serve a local fake of the Compute Engine REST API.")
    parser.add_argument("--port", type=int, default=8089, help="port on 127.0.0.1 (default 8089)")
    parser.add_argument("--op-delay", type=float, default=0.5, help="seconds before an operation is DONE")
    parser.add_argument("--stockout-zone", action="append", default=[], help="zone whose inserts stock out")
    parser.add_argument(
        "--permissions",
        help="JSON file {token: [permission, ...]}: requests need a token with the permission",
    )
    parser.add_argument(
        "--podman", action="append", default=[], metavar="INSTANCE=CONTAINER",
        help="an instance (in --project, --zone) whose status follows the container, started by podman start",
    )  # fmt: skip
    parser.add_argument("--project", default="local", help="project of the --podman instances")
    parser.add_argument("--zone", default="local-a", help="zone of the --podman instances")
    args = parser.parse_args()
    permissions = None
    if args.permissions:
        table = json.loads(Path(args.permissions).read_text())
        permissions = {str(token): set(perms) for token, perms in table.items()}
    server = FakeComputeServer(
        Faults(op_delay=args.op_delay, stockout_zones=set(args.stockout_zone)), args.port, permissions
    )
    for instance, container in parse_pairs(args.podman).items():
        server.api.seed_instance(args.project, args.zone, instance, PodmanBacking(container))
    print(f"fake Compute API on {server.endpoint}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.httpd.serve_forever()


if __name__ == "__main__":
    main()
