"""A rig that is being stopped says so, and ends the streams it cannot finish instead of cutting them.

systemd stops vLLM in two steps (the unit, roles/vllm_service): ``ExecStop`` runs
``python -m gemma_rig_guard.drain SECONDS``, which writes the drain file (``GEMMA_RIG_DRAIN_FILE``,
in the unit's RuntimeDirectory) holding the deadline, now + SECONDS; then SIGTERM reaches vLLM, whose
``--shutdown-timeout`` (a little longer than SECONDS) lets the requests it is running finish. While
the file is there, the guard:

- answers ``GET /health`` with 503, so a gateway takes the rig out within its checks;
- answers every new ``POST`` with 503 and ``Retry-After`` (a gateway sends it to another rig: it
  retries a 503), where vLLM itself would answer 500, "cannot schedule new futures after shutdown";
- lets each request in flight run until the deadline. One still running then is ended by the guard:
  a stream that has begun with an error event and ``data: [DONE]``, its chunked body closed as a
  whole one (the official openai SDK raises ``APIError`` with the message), an answer not begun with
  a 503. vLLM sees the request cancelled, as when a client goes away, and aborts it;
- treats an answer vLLM itself aborted as no answer: SIGTERM aborts the requests vLLM took in just
  before the drain file was there, and vLLM answers each as a whole one with ``finish_reason``
  ``abort`` and no text (a 200 the client would take for the model's answer). A JSON answer so
  ended becomes the 503 above, a stream's aborted last event the error event.

A rig killed outright (SIGKILL, a crash, a lost VM) runs none of this: its connections are cut.

The file is the service user's own, but is read as data: anything but a plain number is a drain
whose deadline has passed. No file, or no ``GEMMA_RIG_DRAIN_FILE``: nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FILE_ENV = "GEMMA_RIG_DRAIN_FILE"
# How often a request in flight looks at the file: the deadline is kept to within this.
POLL_SECONDS = 0.25
# The longest drain the writer accepts: a VM's shutdown never waits longer.
MAX_SECONDS = 3600
_READ_MAX = 64
RETRY_AFTER = b"1"
HEALTH = ("GET", "/health")  # vLLM's health check: what a gateway and ready.yml ask
MESSAGE = "the rig is stopping: this request was not finished; send it again"
# vLLM's error shape: the 503's body and the stream's last event carry the same one.
_ERROR = json.dumps(
    {"error": {"message": MESSAGE, "type": "ServiceUnavailableError", "param": None, "code": 503}}
).encode()


# How vLLM writes an aborted choice (its JSON is compact, chunks and answers alike).
_ABORTED = b'"finish_reason":"abort"'


def file_from_env() -> str | None:
    """The drain file's path from the environment; None when unset or empty. A path that is not
    absolute, or that holds ``..``, is an error at start (the unit sets it)."""
    path = os.environ.get(FILE_ENV, "")
    if not path:
        return None
    if not path.startswith("/") or "/../" in f"{path}/" or "\0" in path:
        raise ValueError(f"{FILE_ENV}: {path[:200]!r} is not an absolute path without '..'")
    return path


def deadline(path: str) -> float | None:
    """When the drain ends (time.time()), None when no drain is under way. A file that holds no
    plain finite number, or that cannot be read, is a drain already past its deadline."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(_READ_MAX)
    except FileNotFoundError:
        return None
    except OSError:
        return 0.0
    try:
        value = float(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return 0.0
    # A deadline further off than any drain the writer accepts is no deadline it wrote.
    return value if math.isfinite(value) and value <= time.time() + MAX_SECONDS else 0.0


def draining(path: str | None) -> bool:
    return path is not None and deadline(path) is not None


async def refuse(send: Send) -> None:
    """A 503 in vLLM's error shape, with Retry-After: the request is another rig's to serve."""
    body = _ERROR
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", RETRY_AFTER),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def error_event() -> bytes:
    """The SSE events that end a stream the rig could not finish."""
    return b"data: " + _ERROR + b"\n\ndata: [DONE]\n\n"


async def run(app: ASGIApp, scope: Scope, receive: Receive, send: Send, drain_file: str) -> None:
    """Run ``app`` for one request; end it as the module says if a drain's deadline passes first."""
    lock = asyncio.Lock()
    state: dict[str, Any] = {"started": False, "sse": False, "done": False, "ended": False, "held": None}

    async def forward(message: Message) -> None:
        async with lock:
            if state["ended"]:
                return  # the guard has ended this response: what vLLM still sends goes nowhere
            if message["type"] == "http.response.start":
                state["started"] = True
                ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
                state["sse"] = ctype.startswith(b"text/event-stream")
                if not state["sse"]:
                    state["held"] = message  # sent with the body's first part, once it is seen
                    return
            elif message["type"] == "http.response.body":
                if _ABORTED in message.get("body", b"") and draining(drain_file):
                    state["ended"] = True
                    if state["held"] is not None:
                        await refuse(send)
                    else:
                        await send({"type": "http.response.body", "body": error_event(), "more_body": False})
                    return
                if not message.get("more_body", False):
                    state["done"] = True
            if state["held"] is not None:
                await send(state["held"])
                state["held"] = None
            await send(message)

    task = asyncio.ensure_future(app(scope, receive, forward))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_SECONDS)
            if done:
                task.result()
                return
            end = deadline(drain_file)
            if end is None or time.time() < end:
                continue
            async with lock:
                if state["done"] or (state["started"] and not state["sse"]):
                    continue  # an answer already whole or a JSON body under way: let it finish
                state["ended"] = True
                task.cancel()
                if state["started"]:
                    await send({"type": "http.response.body", "body": error_event(), "more_body": False})
                else:
                    await refuse(send)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            return
    finally:
        if not task.done():  # this request was cancelled (its client went away): so is vLLM's work
            task.cancel()


def begin(path: str, seconds: float) -> None:
    """Write the drain file (atomically: a reader never sees half of it) with now + ``seconds``."""
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
        raise ValueError(f"drain seconds must be a number from 0 to {MAX_SECONDS}, got {seconds!r}")
    partial = f"{path}.partial"
    with open(partial, "w", encoding="ascii") as handle:
        handle.write(f"{time.time() + seconds:.3f}\n")
    os.replace(partial, path)


def main(argv: list[str]) -> int:
    """``python -m gemma_rig_guard.drain SECONDS``: the unit's ExecStop."""
    try:
        path = file_from_env()
        if path is None:
            raise ValueError(f"{FILE_ENV} is not set")
        if len(argv) != 1:
            raise ValueError("usage: python -m gemma_rig_guard.drain SECONDS")
        begin(path, float(argv[0]))
    except (ValueError, OSError) as exc:
        print(f"gemma_rig_guard.drain: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
