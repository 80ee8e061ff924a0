"""A stand-in for a rig's vLLM endpoint, for testing the gateway on the controller without vLLM.

It answers what the gateway and its clients use, the way vLLM 0.29 does: ``GET /health`` (200, or
503 while ``healthy`` is false), ``GET /v1/models`` (the served names: the build, then its alias if
it has one, each a ModelCard) and ``POST /v1/chat/completions``, plain or streamed as server-sent
events (``stream: true``), each answer naming the build, whichever served name the request used
(vLLM 0.29's OpenAIServingModels.model_name: the first served name). A request naming another
model is vLLM's 404; one without a model is served. Streams send their first chunk at once and the rest after ``stream_pause`` seconds, so a
client can tell whether anything between them buffered the response. With ``lockstep`` set, a
stream sends ``max_tokens`` chunks instead, each after the first only once the client has released
the semaphore: a client that releases it on each chunk it reads times every hop through whatever
lies between them. Every request is logged with its path, model and Authorization header, and a POST with its
``messages`` (and ``tools``, ``response_format`` when sent) as the client sent them (what reached the model, byte for byte).

``POST /v1/completions`` answers a plain text completion the same way. Every body it sends is held
to the official ``openai`` client's types before it leaves (``check_response``): those pydantic
models accept any extra key, so a misspelt field would reach a client unnoticed; here every key
must be a declared field, recursively, or one that vLLM 0.29.0's own type adds (``VLLM_EXTRAS``).
Errors have vLLM's shape, ``{"error": {"message", "type", "param", "code"}}`` (``ErrorResponse``
in vllm/entrypoints/serve/engine/protocol.py). A body that fails is not sent: the client gets a
500 naming the field (a stream is cut), it is logged, and ``mismatches`` records it.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

LOG = logging.getLogger(__name__)
# The client's name as the gateway passes it (roles/gateway/vars/main.yml, _gateway_client_header).
CLIENT_HEADER = "X-Gemma-Rig-Client"

# Fields vLLM 0.29.0's response types declare beyond the openai client's (ModelCard in
# vllm/entrypoints/serve/engine/protocol.py): the only extra keys a body may carry.
VLLM_EXTRAS: dict[str, frozenset[str]] = {
    "Model": frozenset({"root", "parent", "max_model_len", "permission"})
}
# vLLM's ErrorResponse.error (ErrorInfo): exactly these keys, param may be null.
VLLM_ERROR_KEYS = frozenset({"message", "type", "param", "code"})


class ResponseMismatch(Exception):
    """A body vLLM would never send: names the field and what is wrong with it."""


@functools.cache
def _openai_types() -> dict[str, Any]:
    from openai.types import Completion, Model
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    return {"model": Model, "chat": ChatCompletion, "chunk": ChatCompletionChunk, "completion": Completion}


def _no_extras(value: Any, where: str) -> None:
    """Every key a declared field of its model (openai's models keep unknown keys as extras)."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        extras = set(value.model_extra or {}) - VLLM_EXTRAS.get(type(value).__name__, frozenset())
        if extras:
            raise ResponseMismatch(
                f"{where}.{sorted(extras)[0]}: not a field of openai's {type(value).__name__}"
            )
        for name in type(value).model_fields:
            _no_extras(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _no_extras(item, f"{where}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_extras(item, f"{where}[{key!r}]")


def check_response(kind: str, body: Any, status: int = 200) -> None:
    """Raise ResponseMismatch unless ``body`` is what vLLM sends as ``kind``.

    ``kind``: ``models`` (GET /v1/models), ``chat``, ``chunk`` (one streamed event),
    ``completion``, or ``error`` (any status >= 400).
    """
    from pydantic import ValidationError

    if kind == "error":
        error = body.get("error") if isinstance(body, dict) and set(body) == {"error"} else None
        if not isinstance(error, dict) or set(error) != VLLM_ERROR_KEYS:
            raise ResponseMismatch(f"error: {body!r} is not vLLM's {{'error': {sorted(VLLM_ERROR_KEYS)}}}")
        if not isinstance(error["message"], str) or not isinstance(error["type"], str):
            raise ResponseMismatch("error.message and error.type: strings in vLLM's ErrorInfo")
        if error["param"] is not None and not isinstance(error["param"], str):
            raise ResponseMismatch(f"error.param: {error['param']!r} is neither a string nor null")
        if error["code"] != status:
            raise ResponseMismatch(f"error.code: {error['code']!r}, the HTTP status is {status}")
        return
    if kind == "models":
        if not isinstance(body, dict) or set(body) != {"object", "data"} or body["object"] != "list":
            raise ResponseMismatch(f"models: {body!r} is not vLLM's ModelList {{object: list, data}}")
        items = [(f"models.data[{i}]", "model", item) for i, item in enumerate(body["data"])]
    else:
        items = [(kind, kind, body)]
    for where, type_key, item in items:
        model = _openai_types()[type_key]
        try:
            parsed = model.model_validate(item, strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            raise ResponseMismatch(f"{where}.{field}: {first['msg']}") from exc
        _no_extras(parsed, where)


def error_body(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's error answer (create_error_response in vllm/entrypoints/serve/exception_handling)."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def models_body(names: list[str]) -> dict[str, Any]:
    """GET /v1/models as vLLM answers it: one ModelCard for each served name, in order."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                        "owned_by": "vllm", "root": names[0], "parent": None,
                                        "max_model_len": 2048, "permission": []}
                                       for name in names]}  # fmt: skip


def chat_body(model: str) -> dict[str, Any]:
    """A non-streamed chat completion answering "Paris"."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


def chunk_body(model: str, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """One streamed chat.completion.chunk event."""
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    if finish_reason:
        choice["finish_reason"] = finish_reason
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [choice]}  # fmt: skip


def completion_body(model: str) -> dict[str, Any]:
    """A non-streamed text completion (POST /v1/completions) answering " Paris"."""
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": " Paris", "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


class FakeRig:
    """One fake rig on 127.0.0.1 (a free port); a context manager."""

    def __init__(self, model: str, stream_pause: float = 0.5, alias: str = "") -> None:
        self.model = model
        self.alias = alias
        self.stream_pause = stream_pause
        self.healthy = True
        self.lockstep: threading.Semaphore | None = None
        self.log: list[dict] = []
        self.mismatches: list[str] = []  # bodies refused because vLLM would never send them
        # The rig guard's per-client counters (gemma_rig_client_tokens_total on /metrics), by the
        # client the gateway names: what a rig's metrics reveal about every client.
        self.client_tokens: dict[tuple[str, str], int] = {}
        rig = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _checked(self, kind: str, body: dict, status: int = 200) -> bool:
                try:
                    check_response(kind, body, status)
                except ResponseMismatch as exc:
                    LOG.error("fake rig answer to %s is not vLLM's: %s", self.path, exc)
                    rig.mismatches.append(str(exc))
                    return False
                return True

            def _json(self, status: int, body: dict, kind: str = "error") -> None:
                if not self._checked("error" if status >= 400 else kind, body, status):
                    status, body = 500, error_body(500, "The fake's answer is not vLLM's: " + rig.mismatches[-1],
                                                   "InternalServerError")  # fmt: skip
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                rig.log.append({"path": self.path, "authorization": self.headers.get("Authorization")})
                if self.path == "/health":
                    self.send_response(200 if rig.healthy else 503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path == "/v1/models":
                    self._json(200, models_body(rig.names), "models")
                elif self.path == "/metrics":  # prometheus_client's process collector, as vLLM serves it
                    data = (
                        "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
                        "# TYPE process_cpu_seconds_total counter\n"
                        f"process_cpu_seconds_total {time.process_time()}\n" + rig.usage_text()
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:  # vLLM's handler for FastAPI's HTTPException (exception_handling/handlers/http.py)
                    self._json(404, error_body(404, "Not Found", "Not Found"))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                rig.log.append(
                    {
                        "path": self.path,
                        "model": body.get("model"),
                        "authorization": self.headers.get("Authorization"),
                        "messages": body.get("messages"),
                        **{k: body[k] for k in ("tools", "response_format", "max_tokens") if k in body},
                    }
                )
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    self._json(404, error_body(404, "Not Found", "Not Found"))
                    return
                if body.get("model") and body["model"] not in rig.names:  # vLLM's check_model
                    self._json(404, error_body(404, f"The model `{body['model']}` does not exist.",
                                               "NotFoundError", "model"))  # fmt: skip
                    return
                if self.path == "/v1/completions":
                    rig.count(self.headers.get(CLIENT_HEADER), completion_body(rig.model)["usage"])
                    self._json(200, completion_body(rig.model), "completion")
                    return
                if not body.get("stream"):
                    rig.count(self.headers.get(CLIENT_HEADER), chat_body(rig.model)["usage"])
                    self._json(200, chat_body(rig.model), "chat")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                lockstep = rig.lockstep
                texts = [f"t{n}" for n in range(body.get("max_tokens", 2))] if lockstep else ["Par", "is"]
                for n, text in enumerate(texts):
                    if n and lockstep is None:
                        time.sleep(rig.stream_pause)
                    elif n and not lockstep.acquire(timeout=10):
                        return  # the client stopped reading: cut the stream
                    if not self._chunk(chunk_body(rig.model, {"content": text})):
                        return
                if not self._chunk(chunk_body(rig.model, {}, "stop")):
                    return
                self._raw(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")

            def _chunk(self, event: dict) -> bool:
                """Send one event; False (the stream cut, no last chunk) if vLLM would never send it."""
                if not self._checked("chunk", event):
                    self.close_connection = True
                    return False
                self._raw(b"data: " + json.dumps(event).encode() + b"\n\n")
                return True

            def _raw(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, at every exit.
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def count(self, client: str | None, usage: dict[str, int]) -> None:
        """Count an answer's usage under the client the gateway named (the guard's ``direct``
        when none did)."""
        name = client or "direct"
        for kind in ("prompt", "completion"):
            key = (name, kind)
            self.client_tokens[key] = self.client_tokens.get(key, 0) + usage[f"{kind}_tokens"]

    def usage_text(self) -> str:
        """The guard's per-client series, as prometheus_client writes them."""
        lines = [
            "# HELP gemma_rig_client_tokens_total Tokens the rig's answers reported in usage, by the "
            "client the gateway named and kind.",
            "# TYPE gemma_rig_client_tokens_total counter",
        ]
        lines += [
            f'gemma_rig_client_tokens_total{{client="{client}",kind="{kind}"}} {value}.0'
            for (client, kind), value in sorted(self.client_tokens.items())
        ]
        return "\n".join(lines) + "\n"

    @property
    def names(self) -> list[str]:
        """vLLM's --served-model-name, in order: the build, then its alias."""
        return [self.model] + ([self.alias] if self.alias else [])

    def __enter__(self) -> FakeRig:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
