"""ASGI middleware for vLLM's ``--middleware``: a rig serves its documented paths only, each behind its key.

vLLM 0.29.0 checks ``--api-key``/``VLLM_API_KEY`` only under /v1 (and /v2, /inference, /cohere):
``POST /invocations`` runs a chat completion without a key, and /tokenize, /load, /server_info and
the rest answer anyone who reaches the port. This guard sits outside every other middleware (vLLM
adds ``--middleware`` classes last, and Starlette runs the last added first) and:

- serves only the ``METHOD /path`` pairs in ``GEMMA_RIG_SERVED_PATHS`` (space-separated
  ``METHOD:/path`` words, from inventory/group_vars/all/rig.yml through tpu.env), compared with the
  request's exact path: no prefix, no normalisation, so ``/v1/../tokenize`` or ``//invocations``
  match nothing; anything else gets a 404 that names the path as not served by this rig;
- asks every served path for ``Authorization: Bearer <VLLM_API_KEY>`` when a key is set, except
  the pairs in ``GEMMA_RIG_OPEN_PATHS`` (GET /health: load balancers and readiness probes), and
  answers a missing or wrong key with 401, compared in constant time as vLLM's own check does.

vLLM builds the class with ``app.add_middleware(cls)`` and no arguments, so it reads its settings
from the environment; an unset or empty ``GEMMA_RIG_SERVED_PATHS`` is an error at start, never an
open rig.

A rig being stopped answers /health and new requests with 503 and ends the requests it cannot
finish in time as a whole answer would end (drain.py).

It also counts, in the registry vLLM's /metrics serves: the tokens each client's answers reported
on the completion paths (usage.py), the free space of the rig's disks (filesystem.py) and, where
``nvidia-smi`` is, the GPU's own figures (gpu.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from . import drain, filesystem, gpu, usage

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SERVED_ENV = "GEMMA_RIG_SERVED_PATHS"
OPEN_ENV = "GEMMA_RIG_OPEN_PATHS"
KEY_ENV = "VLLM_API_KEY"
_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
# A refused path is echoed back cut to this length (it is the client's own text, JSON-escaped).
_ECHO_MAX = 200


def parse_pairs(text: str, what: str) -> frozenset[tuple[str, str]]:
    """``METHOD:/path`` words as a set of (method, path); anything else is an error naming it."""
    pairs = set()
    for word in text.split():
        method, sep, path = word.partition(":")
        if not sep or method not in _METHODS or not path.startswith("/") or "//" in path or "/." in path:
            raise ValueError(f"{what}: {word!r} is not METHOD:/path (for example GET:/health)")
        pairs.add((method, path))
    return frozenset(pairs)


class ServedPathsGuard:
    """Pure ASGI middleware: the documented paths only, each behind the key but the open ones."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.served = parse_pairs(os.environ.get(SERVED_ENV, ""), SERVED_ENV)
        if not self.served:
            raise ValueError(
                f"{SERVED_ENV} is unset or empty: the guard would serve nothing (tpu.env sets it)"
            )
        self.open = parse_pairs(os.environ.get(OPEN_ENV, ""), OPEN_ENV)
        if not self.open <= self.served:
            raise ValueError(
                f"{OPEN_ENV} names pairs {SERVED_ENV} does not serve: {sorted(self.open - self.served)}"
            )
        key = os.environ.get(KEY_ENV, "")
        # Digests of equal length, so the comparison's time says nothing of the key's length.
        self.key_digest = hashlib.sha256(key.encode()).digest() if key else None
        self.drain_file = drain.file_from_env()
        filesystem.register()
        gpu.register()

    def key_ok(self, scope: Scope) -> bool:
        if self.key_digest is None:
            return True
        values = [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, token = values[0].decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return secrets.compare_digest(hashlib.sha256(token.encode("latin-1")).digest(), self.key_digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            # A websocket (vLLM's realtime API) is no documented path: closed before it is accepted.
            await send({"type": "websocket.close", "code": 1008})
            return
        path = scope["path"]
        root = scope.get("root_path", "")
        if root:
            if not path.startswith(root):
                await _refuse(send, 404, f"path {path[:_ECHO_MAX]} is not served by this rig")
                return
            path = path[len(root) :]
        pair = (scope["method"], path)
        if pair not in self.served:
            await _refuse(send, 404, f"{pair[0][:16]} {path[:_ECHO_MAX]} is not served by this rig")
        elif pair not in self.open and not self.key_ok(scope):
            await _refuse(send, 401, "missing or wrong API key", {b"www-authenticate": b"Bearer"})
        elif (
            self.drain_file is not None
            and (pair == drain.HEALTH or pair[0] == "POST")
            and drain.draining(self.drain_file)
        ):
            await drain.refuse(send)
        elif pair in usage.COUNTED_PATHS:
            await usage.counted(self._inner, scope, receive, send, path)
        else:
            await self._inner(scope, receive, send)

    async def _inner(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's app, under the drain's deadline for a request that generates (a POST)."""
        if self.drain_file is not None and scope["method"] == "POST":
            await drain.run(self.app, scope, receive, send, self.drain_file)
        else:
            await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, message: str, headers: dict[bytes, bytes] | None = None) -> None:
    """An OpenAI-style JSON error; the request body is never read."""
    body = json.dumps(
        {"error": {"message": message, "type": "gemma_rig_guard", "code": status}}, ensure_ascii=True
    ).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": head + list((headers or {}).items())}
    )
    await send({"type": "http.response.body", "body": body})
