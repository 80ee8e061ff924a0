"""Tokens per client: read ``usage`` from the answers of the completion paths and count it.

The gateway names the client in ``X-Gemma-Rig-Client`` (always its own word, never the client's).
The label is that name when it is a plain word, ``invalid`` when it is anything else (two headers,
quotes, newlines, too long), ``direct`` when there is none (a request that did not come through a
gateway). Counted in prometheus_client's default registry, which vLLM's /metrics serves (with one
API server; vLLM's multiprocess registry for ``--api-server-count`` > 1 reads only its own files).

A JSON answer carries ``usage``. A stream carries it only when the request asked for it
(``stream_options.include_usage``): when a stream request has no ``stream_options`` at all, asks
for one answer (``n`` 1) and for one prompt, the guard adds ``"stream_options":
{"include_usage":true}`` to the request and takes the usage-only chunk vLLM then sends back out of
the stream, so the client gets the stream it asked for. vLLM 0.29.0 moves ``system_fingerprint``
from the last choice chunk to that usage chunk when usage is on; the guard holds that last chunk
until the next event and puts the fingerprint back where vLLM would have written it. Any other
stream is passed on untouched and counted only if it carries usage itself.

Nothing here may break an answer: every parse is guarded, an answer the guard cannot follow
(garbage, an event past ``MAX_EVENT`` bytes, a body past ``MAX_JSON``) is passed on as it came and
not counted.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import Counter

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CLIENT_HEADER = b"x-gemma-rig-client"
COUNTED_PATHS = frozenset({("POST", "/v1/chat/completions"), ("POST", "/v1/completions")})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# A request body read whole to add stream_options; a larger one is passed on as it is.
MAX_REQUEST = 16 * 1024 * 1024
# A JSON answer read for its usage; an SSE event held while it is incomplete.
MAX_JSON = 16 * 1024 * 1024
MAX_EVENT = 1024 * 1024
# A usage figure past this is no figure vLLM sends (a context is far shorter): not counted.
MAX_TOKENS = 1 << 31
# vLLM's flag that puts usage in every stream (the client then gets it anyway: nothing to add).
FORCED_FLAG = "--enable-force-include-usage"
EXTRA_ARGS_ENV = "RIG_EXTRA_ARGS"
_INCLUDE = b'"stream_options":{"include_usage":true},'
# What vLLM 0.29.0's stream chunks declare after system_fingerprint (chat and completion): a
# terminal chunk holding one of them gets no fingerprint put back (it would be out of place).
_AFTER_FINGERPRINT = ("prompt_token_ids", "prompt_text", "metrics")
_FINGERPRINT = re.compile(rb'"system_fingerprint":("(?:[^"\\]|\\.)*")')

TOKENS = Counter(
    "gemma_rig_client_tokens",
    "Tokens the rig's answers reported in usage, by the client the gateway named and kind.",
    ["client", "kind"],
)


def client_label(scope: Scope) -> str:
    """The gateway's name for the client, ``invalid`` if it is no plain name, ``direct`` if none."""
    values = [v for k, v in scope.get("headers", []) if k.lower() == CLIENT_HEADER]
    if not values:
        return "direct"
    if len(values) != 1:
        return "invalid"
    name = values[0].decode("latin-1")
    return name if _NAME.match(name) else "invalid"


def count(client: str, usage: Any) -> bool:
    """Count a ``usage`` object; False (nothing counted) unless both figures are plain numbers."""
    if not isinstance(usage, dict):
        return False
    figures = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    if not all(type(f) is int and 0 <= f < MAX_TOKENS for f in figures):
        return False
    TOKENS.labels(client=client, kind="prompt").inc(figures[0])
    TOKENS.labels(client=client, kind="completion").inc(figures[1])
    return True


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def wants_injection(path: str, body: Any) -> bool:
    """A stream request for one answer to one prompt with no stream_options of its own, to a vLLM
    that does not send usage anyway (--enable-force-include-usage in tpu.env's RIG_EXTRA_ARGS)."""
    if not isinstance(body, dict) or body.get("stream") is not True or "stream_options" in body:
        return False
    if FORCED_FLAG in os.environ.get(EXTRA_ARGS_ENV, "").split():
        return False
    if body.get("n", 1) not in (1, None) or body.get("best_of") not in (None, 1):
        return False
    if path == "/v1/completions":
        prompt = body.get("prompt")
        return isinstance(prompt, str) or (isinstance(prompt, list) and all(type(t) is int for t in prompt))
    return True


def _inject(raw: bytes) -> bytes:
    """``raw`` (a JSON object) with stream_options.include_usage first: nothing else moves."""
    start = raw.index(b"{") + 1
    rest = raw[start:].lstrip()
    return raw[:start] + (_INCLUDE[:-1] if rest.startswith(b"}") else _INCLUDE) + raw[start:]


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's messages as received, and its body when it came whole within MAX_REQUEST."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        size += len(message.get("body", b""))
        if size > MAX_REQUEST:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives ``messages`` first, then the real one's."""
    queue = list(messages)

    async def replayed() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return replayed


def _with_length(scope: Scope, length: int) -> Scope:
    """``scope`` with its Content-Length (when it has one) giving ``length``."""
    headers = scope.get("headers", [])
    if not any(k.lower() == b"content-length" for k, _ in headers):
        return scope
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return {**scope, "headers": [*kept, (b"content-length", str(length).encode())]}


class _Stream:
    """Follows an SSE answer event by event; with ``strip``, takes the usage chunk out."""

    def __init__(self, client: str, strip: bool) -> None:
        self.client, self.strip = client, strip
        self.buffer = b""
        self.held: bytes | None = None  # a terminal chunk waiting for the usage chunk (strip only)
        self.lost = False  # the stream could not be followed: pass on as it comes, count nothing
        self.counted = False

    def feed(self, data: bytes) -> bytes:
        """What to send the client now for ``data`` from vLLM (all of it, unless stripping)."""
        if self.lost:
            return data
        self.buffer += data
        out = []
        while (end := self.buffer.find(b"\n\n")) >= 0:
            event, self.buffer = self.buffer[: end + 2], self.buffer[end + 2 :]
            out.append(self._event(event))
        if len(self.buffer) > MAX_EVENT:
            self.lost = True
            if self.strip:
                out.append(self.release() + self.buffer)
            self.buffer = b""
        return b"".join(out) if self.strip else data

    def release(self) -> bytes:
        held, self.held = self.held or b"", None
        return held

    def finish(self) -> bytes:
        """The end of the answer: whatever is still held goes out as it is."""
        rest = self.release() + (self.buffer if self.strip and not self.lost else b"")
        self.buffer = b""
        return rest

    def _event(self, event: bytes) -> bytes:
        if not self.strip and b'"usage"' not in event:
            return b""  # read only: an event without usage is not worth parsing
        chunk = _json(event[6:]) if event.startswith(b"data: {") else None
        if not isinstance(chunk, dict):
            return self.release() + event
        usage = chunk.get("usage")
        choices = chunk.get("choices")
        usage_only = choices == [] and isinstance(usage, dict)
        if usage_only and not self.counted:
            self.counted = count(self.client, usage)
        if not self.strip:
            return b""
        if usage_only:
            return self._put_back_fingerprint(event)
        out = self.release()
        if isinstance(choices, list) and any(
            isinstance(c, dict) and c.get("finish_reason") is not None for c in choices
        ):
            self.held = event
            return out
        return out + event

    def _put_back_fingerprint(self, usage_event: bytes) -> bytes:
        """The held terminal chunk, with the usage chunk's fingerprint where vLLM puts it."""
        held = self.release()
        found = _FINGERPRINT.search(usage_event)
        if not held or not found or b'"system_fingerprint"' in held:
            return held
        chunk = _json(held[6:])
        if not isinstance(chunk, dict) or any(k in chunk for k in _AFTER_FINGERPRINT):
            return held
        body = held.rstrip(b"\n")
        if not body.endswith(b"}"):
            return held
        return body[:-1] + b',"system_fingerprint":' + found.group(1) + b"}" + held[len(body) :]


async def counted(app: ASGIApp, scope: Scope, receive: Receive, send: Send, path: str) -> None:
    """Run ``app`` for a completion request to ``path``, counting the tokens its answer reports."""
    client = client_label(scope)
    messages, raw = await _read_body(receive)
    strip = False
    if raw is not None and raw.lstrip().startswith(b"{") and wants_injection(path, _json(raw)):
        raw = _inject(raw)
        scope = _with_length(scope, len(raw))
        messages = [{"type": "http.request", "body": raw, "more_body": False}]
        strip = True
    receive = _replay(messages, receive)
    state: dict[str, Any] = {"kind": None}
    body: list[bytes] = []
    size = 0
    stream: _Stream | None = None

    async def send_counted(message: Message) -> None:
        nonlocal stream, size
        if message["type"] == "http.response.start":
            kind = None
            if message.get("status") == 200:
                ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
                if ctype.startswith(b"text/event-stream"):
                    kind = "sse"
                    stream = _Stream(client, strip)
                elif ctype.startswith(b"application/json"):
                    kind = "json"
            state["kind"] = kind
            await send(message)
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        data = message.get("body", b"")
        more = message.get("more_body", False)
        if state["kind"] == "sse" and stream is not None:
            out = stream.feed(data)
            if not more:
                out += stream.finish()
            await send({**message, "body": out})
            return
        if state["kind"] == "json":
            size += len(data)
            if size <= MAX_JSON:
                body.append(data)
            if not more and size <= MAX_JSON:
                answer = _json(b"".join(body))
                if isinstance(answer, dict):
                    count(client, answer.get("usage"))
        await send(message)

    await app(scope, receive, send_counted)
