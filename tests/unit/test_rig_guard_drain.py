"""The guard's drain (roles/vllm/files/gemma_rig_guard/gemma_rig_guard/drain.py): a rig being stopped
answers its health check and new requests with 503, lets requests in flight run until the deadline
the unit's ExecStop wrote, and ends what still runs then as a whole answer ends: a begun stream with
an error event and [DONE], an answer not begun with a 503. The app under the guard is a stand-in that
streams or answers slowly, as vLLM does, and records whether it was cancelled; the drain file is a
real file, written by the module's own ExecStop entry point. The whole stop on a real rig (systemd,
vLLM's --shutdown-timeout, the gateway): tests/e2e/test_98_wake.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_rig_guard import BEARER, GUARD_SRC, _guard_env

if str(GUARD_SRC) not in sys.path:
    sys.path.insert(0, str(GUARD_SRC))

from gemma_rig_guard import ServedPathsGuard, drain

CHAT = "/v1/chat/completions"
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
# What vLLM answers for a request SIGTERM aborted (its compact JSON): a whole answer with no text.
ABORTED = b'{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":"abort"}]}'
ABORTED_EVENT = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"abort"}]}\n\n'


@dataclass
class StandIn:
    """vLLM's part: a stream of ``events`` events ``pace`` s apart, or one JSON answer after ``pace``."""

    events: int = 0
    pace: float = 0.05
    answer: bytes = b'{"object":"chat.completion"}'
    last_event: bytes = b""  # sent just before [DONE]: vLLM's chunk with the finish reason
    cancelled: bool = False
    finished: bool = False
    calls: int = 0

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        try:
            await receive()
            if scope["path"] != CHAT or self.events == 0:
                await asyncio.sleep(self.pace)
                body = self.answer
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/json")]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                self.finished = True
                return
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
            for _ in range(self.events):
                await send({"type": "http.response.body", "body": EVENT, "more_body": True})
                await asyncio.sleep(self.pace)
            if self.last_event:
                await send({"type": "http.response.body", "body": self.last_event, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
            self.finished = True
        except asyncio.CancelledError:
            self.cancelled = True
            raise


@dataclass
class Client:
    """What the client received, message by message."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    ended_at: float | None = None  # time.time() when the body ended

    async def send(self, message) -> None:
        self.messages.append(dict(message))
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.ended_at = time.time()

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")

    @property
    def headers(self) -> dict[bytes, bytes]:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        return dict(start["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    @property
    def closed(self) -> bool:
        """The last message ends the body, and it is the only one that does."""
        ends = [m for m in self.messages if m["type"] == "http.response.body" and not m.get("more_body")]
        return len(ends) == 1 and self.messages[-1] is ends[0]


def scope(method: str, path: str, key: bool = True) -> dict[str, Any]:
    headers = [(b"authorization", BEARER["Authorization"].encode())] if key else []
    headers.append((b"content-type", b"application/json"))
    return {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}


async def receive() -> dict[str, Any]:
    return {
        "type": "http.request",
        "body": b'{"model":"m","stream":true,"stream_options":{}}',
        "more_body": False,
    }


@pytest.fixture
def drain_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The guard's environment as the unit gives it, the drain file not written yet."""
    _guard_env(monkeypatch)
    path = tmp_path / "run" / "drain"
    path.parent.mkdir()
    monkeypatch.setenv(drain.FILE_ENV, str(path))
    return path


def begin(path: Path, seconds: float) -> None:
    """ExecStop's own entry point, as systemd runs it (a process of its own)."""
    env = {**os.environ, drain.FILE_ENV: str(path), "PYTHONPATH": str(GUARD_SRC)}
    done = subprocess.run(
        [sys.executable, "-m", "gemma_rig_guard.drain", str(seconds)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


async def call(guard: ServedPathsGuard, method: str, path: str, key: bool = True) -> Client:
    client = Client()
    await guard(scope(method, path, key), receive, client.send)
    return client


def drained(app: StandIn, drain_file: Path, seconds: float, after: float) -> tuple[Client, float]:
    """One chat through the guard over ``app``; ``after`` s in, ExecStop begins a drain of
    ``seconds``. What the client got, and the drain's deadline as ExecStop wrote it."""
    guard = ServedPathsGuard(app)

    async def scenario() -> tuple[Client, float]:
        client = Client()
        request = asyncio.ensure_future(guard(scope("POST", CHAT), receive, client.send))
        await asyncio.sleep(after)
        begin(drain_file, seconds)
        deadline = drain.deadline(str(drain_file))
        assert deadline is not None
        await asyncio.wait_for(request, 5)
        return client, deadline

    return asyncio.run(scenario())


def errors(body: bytes) -> list[dict]:
    """The error events of an SSE body."""
    events = [e[6:] for e in body.split(b"\n\n") if e.startswith(b"data: {")]
    return [json.loads(e)["error"] for e in events if b'"error"' in e]


def test_without_a_drain_the_stream_passes_untouched(drain_file: Path) -> None:
    app = StandIn(events=5, pace=0.01)
    client = asyncio.run(call(ServedPathsGuard(app), "POST", CHAT))
    assert client.status == 200 and client.closed and app.finished
    assert client.body.count(EVENT) == 5 and client.body.endswith(b"data: [DONE]\n\n")
    assert errors(client.body) == []


def test_a_draining_rig_refuses_health_and_new_requests_but_not_reads(drain_file: Path) -> None:
    app = StandIn(pace=0)
    guard = ServedPathsGuard(app)
    begin(drain_file, 30)

    async def calls():
        return [await call(guard, m, p) for m, p in (("GET", "/health"), ("POST", CHAT),
                ("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/metrics"))]  # fmt: skip

    health, chat, completion, models, metrics = asyncio.run(calls())
    for refused in (health, chat, completion):
        assert refused.status == 503 and refused.headers[b"retry-after"] == b"1"
        error = json.loads(refused.body)["error"]
        assert (
            error["code"] == 503
            and error["type"] == "ServiceUnavailableError"
            and "stopping" in error["message"]
        )
    assert models.status == metrics.status == 200
    assert app.calls == 2  # only the two reads reached vLLM


def test_the_key_and_the_served_paths_are_checked_before_the_drain(drain_file: Path) -> None:
    guard = ServedPathsGuard(StandIn())
    begin(drain_file, 30)
    assert asyncio.run(call(guard, "POST", CHAT, key=False)).status == 401
    assert asyncio.run(call(guard, "POST", "/tokenize")).status == 404


def test_a_stream_still_running_at_the_deadline_ends_with_an_error_event(drain_file: Path) -> None:
    app = StandIn(events=400, pace=0.02)
    client, deadline = drained(app, drain_file, 0.5, after=0.2)
    assert app.cancelled and not app.finished
    assert client.ended_at is not None and client.ended_at >= deadline  # never before the deadline
    assert client.status == 200 and client.closed
    assert client.body.count(EVENT) > 5
    assert client.body.endswith(b"data: [DONE]\n\n")
    (error,) = errors(client.body)
    assert error["code"] == 503 and "stopping" in error["message"]
    assert client.body.index(b'"error"') > client.body.rindex(EVENT)  # after every event that came


def test_a_stream_that_finishes_within_the_drain_is_whole(drain_file: Path) -> None:
    app = StandIn(events=20, pace=0.02)
    client, _ = drained(app, drain_file, 30, after=0.1)
    assert app.finished and not app.cancelled and client.closed
    assert client.body.count(EVENT) == 20 and errors(client.body) == []


def test_an_answer_not_begun_at_the_deadline_is_a_503_to_send_again(drain_file: Path) -> None:
    app = StandIn(pace=10)  # a JSON answer vLLM is still generating
    client, _ = drained(app, drain_file, 0.2, after=0.1)
    assert app.cancelled and client.status == 503 and client.closed
    assert client.headers[b"retry-after"] == b"1"


def test_a_client_that_goes_away_cancels_the_request_under_the_drain(drain_file: Path) -> None:
    app = StandIn(events=400, pace=0.02)
    guard = ServedPathsGuard(app)

    async def scenario() -> None:
        request = asyncio.ensure_future(guard(scope("POST", CHAT), receive, Client().send))
        await asyncio.sleep(0.1)
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert app.cancelled and not app.finished


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"soon",
        b"nan",
        b"inf",
        b"-inf",
        b"1e400",
        b"\xff\xfe",
        b"1.0; rm -rf /",
        b"{{ 7*7 }}",
        b"9" * 500,
    ],
)
def test_a_drain_file_that_holds_no_plain_number_is_a_drain_already_due(
    drain_file: Path, content: bytes
) -> None:
    drain_file.write_bytes(content)
    deadline = drain.deadline(str(drain_file))
    assert deadline is not None and deadline <= time.time()  # due: a drain, and no wait for it
    app = StandIn(events=400, pace=0.02)
    guard = ServedPathsGuard(app)
    assert asyncio.run(call(guard, "GET", "/health")).status == 503
    client = asyncio.run(call(guard, "POST", CHAT))
    assert client.status == 503 and app.calls == 0


def test_a_drain_file_that_cannot_be_read_is_a_drain_already_due(drain_file: Path) -> None:
    drain_file.mkdir()  # a directory where the file should be
    assert drain.deadline(str(drain_file)) == 0.0
    assert drain.draining(str(drain_file))


@pytest.mark.parametrize("value", ["run/drain", "/run/../etc/passwd", "/run/vllm/..", " /run/drain"])
def test_a_drain_path_that_is_not_plain_absolute_is_refused_at_start(
    drain_file: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(drain.FILE_ENV, value)
    with pytest.raises(ValueError, match=drain.FILE_ENV):
        ServedPathsGuard(StandIn())


def test_execstop_writes_the_deadline_whole(drain_file: Path) -> None:
    before = time.time()
    begin(drain_file, 20)
    deadline = drain.deadline(str(drain_file))
    assert deadline is not None and before + 20 <= deadline <= time.time() + 20  # now + 20, as written
    assert not Path(f"{drain_file}.partial").exists()


@pytest.mark.parametrize("argv", [["-1"], ["nan"], ["inf"], ["3601"], ["ten"], [], ["1", "2"]])
def test_execstop_refuses_bad_seconds_with_one_line_and_writes_nothing(
    drain_file: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert drain.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gemma_rig_guard.drain: ") and err.count("\n") == 1
    assert not drain_file.exists()


def test_execstop_without_its_file_setting_says_so(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv(drain.FILE_ENV, raising=False)
    assert drain.main(["5"]) == 2
    assert drain.FILE_ENV in capsys.readouterr().err


def test_an_answer_vllm_aborted_during_a_drain_is_a_503_to_send_again(drain_file: Path) -> None:
    app = StandIn(pace=0.3, answer=ABORTED)
    client, _ = drained(app, drain_file, 30, after=0.1)
    assert app.finished and client.status == 503 and client.closed
    assert client.headers[b"retry-after"] == b"1" and b"abort" not in client.body


def test_a_stream_vllm_aborted_during_a_drain_ends_with_the_error_event(drain_file: Path) -> None:
    app = StandIn(events=10, pace=0.03, last_event=ABORTED_EVENT)
    client, _ = drained(app, drain_file, 30, after=0.1)
    assert client.status == 200 and client.closed
    assert client.body.count(EVENT) == 10 and b'"abort"' not in client.body
    (error,) = errors(client.body)
    assert error["code"] == 503 and client.body.endswith(b"data: [DONE]\n\n")
    assert client.body.count(b"[DONE]") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_without_a_drain_an_aborted_answer_passes_untouched(drain_file: Path, stream: bool) -> None:
    """vLLM aborts a request whose client went away too: with no drain, the guard changes nothing."""
    app = StandIn(events=3 if stream else 0, pace=0.01, answer=ABORTED, last_event=ABORTED_EVENT)
    client = asyncio.run(call(ServedPathsGuard(app), "POST", CHAT))
    assert client.status == 200 and client.closed
    assert (ABORTED_EVENT in client.body) if stream else (client.body == ABORTED)


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_that_writes_the_abort_marker_in_its_answer_is_not_cut(
    drain_file: Path, stream: bool
) -> None:
    """The model's text is escaped in vLLM's JSON: words that spell an aborted choice are content."""
    text = '","finish_reason":"abort"}]} "finish_reason":"abort"'
    answer = json.dumps({"choices": [{"message": {"content": text}, "finish_reason": "stop"}]},
                        separators=(",", ":")).encode()  # fmt: skip
    event = (
        b"data: " + json.dumps({"choices": [{"delta": {"content": text}}]}, separators=(",", ":")).encode()
    )
    app = StandIn(events=3 if stream else 0, pace=0.05, answer=answer, last_event=event + b"\n\n")
    client, _ = drained(app, drain_file, 30, after=0.02)
    assert client.status == 200 and client.closed and errors(client.body) == []
    assert (event in client.body) if stream else (client.body == answer)
