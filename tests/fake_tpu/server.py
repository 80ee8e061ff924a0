"""HTTP front of the fake Cloud TPU API: routes the REST paths onto FakeTpu.

The thread and context-manager plumbing is FakeComputeServer's (tests/fake_compute/server.py);
only the routes and the state differ. Run by hand: ``python -m tests.fake_tpu --port 8090``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fake_compute.server import FakeComputeServer
from tests.fake_tpu.state import ApiError, FakeTpu, Faults
from tests.fake_tpu.strict import StrictError, check

_L = r"/(?P<version>v2|v2alpha1)/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(_L + p + "$"), h)
    for m, p, h in [
        ("POST", r"/queuedResources", "create_queued"),
        ("GET", r"/queuedResources/(?P<id>[^/]+)", "get_queued"),
        ("DELETE", r"/queuedResources/(?P<id>[^/]+)", "delete_queued"),
        ("GET", r"/nodes/(?P<id>[^/:]+)", "get_node"),
        ("POST", r"/nodes/(?P<id>[^/:]+):getGuestAttributes", "get_guest_attributes"),
        ("DELETE", r"/nodes/(?P<id>[^/]+)", "delete_node"),
        ("GET", r"/operations/(?P<id>[^/]+)", "get_operation"),
    ]
]


def route(method: str, path: str) -> tuple[str, dict[str, str]]:
    """The handler for a request and the path's parts; raises ApiError when there is none."""
    for route_method, pattern, handler in ROUTES:
        match = route_method == method and pattern.match(path)
        if match:
            return handler, match.groupdict()
    raise ApiError(404, f"The fake has no route for {method} {path}")


def dispatch(api: FakeTpu, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
    """Route one request; returns the JSON answer or raises ApiError."""
    handler, a = route(method, path)
    if a["version"] == "v2" and "queued" in handler:  # tpu_node reads queued resources on v2alpha1 only
        raise ApiError(404, f"The fake serves queuedResources on v2alpha1 only: {path}")
    if handler == "create_queued":
        return api.create_queued(a["project"], a["zone"], query, body)
    if handler == "delete_queued":
        return api.delete_queued(a["project"], a["zone"], a["id"], query)
    if handler == "delete_node":
        return api.delete_node(a["project"], a["zone"], a["id"])
    if handler == "get_guest_attributes":
        return api.get_guest_attributes(a["version"], a["zone"], a["id"], body)
    if handler == "get_operation":
        name = f"projects/{a['project']}/locations/{a['zone']}/operations/{a['id']}"
        return api.get_operation(name, a["version"])
    return getattr(api, handler)(a["zone"], a["id"])


# Throttling as Google's APIs mark it (google.rpc.ErrorInfo, reason RATE_LIMIT_EXCEEDED): no quota.
THROTTLED = {
    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
    "reason": "RATE_LIMIT_EXCEEDED",
    "domain": "googleapis.com",
    "metadata": {"service": "tpu.googleapis.com"},
}


class _Handler(BaseHTTPRequestHandler):
    api: FakeTpu  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log replaces the default stderr chatter

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw.strip() else {}
        with self.api.lock:
            self.api.log.append({"method": self.command, "path": parts.path, "query": query, "body": body})
            try:
                if self.api.faults.status_429:
                    self.api.faults.status_429 -= 1
                    raise ApiError(429, "Resource has been exhausted (e.g. check quota).", [THROTTLED])
                status, answer = 200, dispatch(self.api, self.command, parts.path, query, body)
            except ApiError as err:
                status, answer = err.status, err.body
            try:  # the answer as the real service could give it, or a 500 that fails the test
                handler, parts_of = route(self.command, parts.path) if status < 400 else ("", {})
                check(handler, parts_of.get("version", ""), status, answer)
            except StrictError as err:
                self.api.strict_errors.append(f"{self.command} {parts.path}: {err}")
                status, answer = (
                    500,
                    ApiError(500, f"fake answer refused by its own strict check: {err}").body,
                )
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PATCH = _handle


class FakeTpuServer(FakeComputeServer):
    """The fake on 127.0.0.1 with an ephemeral port; ``endpoint`` is tpu_node's ``api_endpoint``."""

    def __init__(self, faults: Faults | None = None, port: int = 0) -> None:
        self.api = FakeTpu(faults)  # type: ignore[assignment]
        handler = type("Handler", (_Handler,), {"api": self.api})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )


def main() -> None:
    """Serve the fake in the foreground until interrupted."""
    parser = argparse.ArgumentParser(description="Serve a local fake of the Cloud TPU REST API.")
    parser.add_argument("--port", type=int, default=8090, help="port on 127.0.0.1 (default 8090)")
    parser.add_argument("--op-delay", type=float, default=0.5, help="seconds before an operation is done")
    parser.add_argument(
        "--provision-delay", type=float, default=2.0, help="seconds before a request is ACTIVE"
    )
    parser.add_argument(
        "--stockout-zone", action="append", default=[], help="zone whose requests fail for capacity"
    )
    args = parser.parse_args()
    faults = Faults(
        op_delay=args.op_delay, provision_delay=args.provision_delay, stockout_zones=set(args.stockout_zone)
    )
    server = FakeTpuServer(faults, args.port)
    print(f"fake Cloud TPU API on {server.endpoint}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.httpd.serve_forever()


if __name__ == "__main__":
    main()
