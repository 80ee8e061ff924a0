"""A stand-in for a rig's vLLM endpoint, for testing the gateway on the controller without vLLM.

It answers what the gateway and its clients use, the way vLLM 0.29 does: ``GET /health`` (200, or
503 while ``healthy`` is false), ``GET /v1/models`` (the one served name) and ``POST
/v1/chat/completions``, plain or streamed as server-sent events (``stream: true``), each answer
naming the served model. A request naming another model is vLLM's 404; one without a model is
served. Streams send their first chunk at once and the rest after ``stream_pause`` seconds, so a
client can tell whether anything between them buffered the response. With ``lockstep`` set, a
stream sends ``max_tokens`` chunks instead, each after the first only once the client has released
the semaphore: a client that releases it on each chunk it reads times every hop through whatever
lies between them. Every request is logged with its path, model and Authorization header, and a POST with its
``messages`` as the client sent them (what reached the model, byte for byte).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


class FakeRig:
    """One fake rig on 127.0.0.1 (a free port); a context manager."""

    def __init__(self, model: str, stream_pause: float = 0.5) -> None:
        self.model = model
        self.stream_pause = stream_pause
        self.healthy = True
        self.lockstep: threading.Semaphore | None = None
        self.log: list[dict] = []
        rig = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _json(self, status: int, body: dict) -> None:
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
                    self._json(200, {"object": "list", "data": [{"id": rig.model, "object": "model"}]})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                rig.log.append(
                    {
                        "path": self.path,
                        "model": body.get("model"),
                        "authorization": self.headers.get("Authorization"),
                        "messages": body.get("messages"),
                    }
                )
                if body.get("model") and body["model"] != rig.model:
                    self._json(404, {"error": {"message": f"The model `{body['model']}` does not exist."}})
                    return
                if not body.get("stream"):
                    self._json(
                        200,
                        {
                            "id": "chatcmpl-fake",
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": rig.model,
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": "Paris"},
                                    "finish_reason": "stop",
                                }
                            ],
                            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                        },
                    )
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
                    self._chunk(
                        {
                            "id": "chatcmpl-fake",
                            "object": "chat.completion.chunk",
                            "created": 0,
                            "model": rig.model,
                            "choices": [{"index": 0, "delta": {"content": text}}],
                        }
                    )
                self._chunk(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": rig.model,
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    }
                )
                self._raw(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")

            def _chunk(self, event: dict) -> None:
                self._raw(b"data: " + json.dumps(event).encode() + b"\n\n")

            def _raw(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeRig:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
