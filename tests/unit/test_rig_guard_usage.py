"""The guard's counts: tokens per client from the answers' ``usage``, and the rig's free disk space.

The guard runs here in front of a stand-in for vLLM's completion routes that builds its chunks
with vLLM 0.29.0's own response classes and its rules (serving.py): usage only with
``stream_options.include_usage``, and then ``system_fingerprint`` on the usage chunk instead of
the last choice chunk. What a client receives through the guard is compared byte for byte with
what the stand-in sends for the client's own request; the counts are read from prometheus_client's
default registry, which vLLM's /metrics serves (checked through vLLM's real app at the end).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.unit.test_rig_guard import BEARER, GUARD_SRC, _guard_env, build_vllm_app

if str(GUARD_SRC) not in sys.path:
    sys.path.insert(0, str(GUARD_SRC))

from gemma_rig_guard import ServedPathsGuard, filesystem, usage

FINGERPRINT = "vllm-0.29.0-5eed1234"
MODEL = "tiny"


def _chunks(body: dict, path: str) -> list[bytes]:
    """The events vLLM 0.29.0 streams for ``body`` (one answer, two tokens), each as it yields it."""
    from vllm.entrypoints.generate.base.protocol import DeltaMessage
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
    )
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponseStreamChoice,
        CompletionStreamResponse,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    options = body.get("stream_options") or {}
    include = bool(options.get("include_usage"))
    continuous = include and bool(options.get("continuous_usage_stats"))
    chat = path == "/v1/chat/completions"
    out = []
    texts = ["Par", "is", ""]
    for n, text in enumerate(texts):
        finish = "stop" if n == len(texts) - 1 else None
        if chat:
            choice = ChatCompletionResponseStreamChoice(
                index=0, delta=DeltaMessage(content=text), finish_reason=finish
            )
            chunk = ChatCompletionStreamResponse(id="c1", created=1, model=MODEL, choices=[choice])
        else:
            choice = CompletionResponseStreamChoice(index=0, text=text, finish_reason=finish)
            chunk = CompletionStreamResponse(id="c1", created=1, model=MODEL, choices=[choice])
        if not include and finish is not None:
            chunk.system_fingerprint = FINGERPRINT
        if continuous:
            chunk.usage = UsageInfo(prompt_tokens=7, completion_tokens=n + 1, total_tokens=8 + n)
        out.append(f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n".encode())
    if include:
        final = UsageInfo(prompt_tokens=7, completion_tokens=3, total_tokens=10)
        cls = ChatCompletionStreamResponse if chat else CompletionStreamResponse
        last = cls(id="c1", created=1, model=MODEL, choices=[], usage=final, system_fingerprint=FINGERPRINT)
        out.append(f"data: {last.model_dump_json(exclude_unset=True, exclude_none=True)}\n\n".encode())
    out.append(b"data: [DONE]\n\n")
    return out


class FakeVllm:
    """The completion routes as vLLM answers them; keeps each request it read."""

    def __init__(self, answer: Callable[[dict, str], tuple[str, list[bytes]]] | None = None) -> None:
        self.requests: list[tuple[dict, bytes, dict]] = []
        self.answer = answer

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append((scope, raw, headers))
        body = json.loads(raw)
        if self.answer is not None:
            ctype, parts = self.answer(body, scope["path"])
        elif body.get("stream"):
            ctype, parts = "text/event-stream", _chunks(body, scope["path"])
        else:
            usage_info = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
            parts = [json.dumps({"id": "c1", "choices": [], "usage": usage_info}).encode()]
            ctype = "application/json"
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype.encode())]}
        )
        for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def run(
    app: Any,
    body: dict | bytes,
    path: str = "/v1/chat/completions",
    headers: list[tuple[bytes, bytes]] | None = None,
    split: int = 0,
    send: Callable[[dict], Any] | None = None,
    length: bool = True,
) -> bytes:
    """One request through ``app`` (the body in pieces of ``split`` bytes); the body the client got."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    pieces = [raw[i : i + split] for i in range(0, len(raw), split)] if split else [raw]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)
    ]
    got: list[bytes] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def collect(message: dict) -> None:
        if send is not None:
            await send(message)
        if message["type"] == "http.response.body":
            got.append(message.get("body", b""))

    auth = [(k.lower().encode(), v.encode()) for k, v in BEARER.items()]
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "root_path": "",
        "headers": auth + ([(b"content-length", str(len(raw)).encode())] if length else []) + (headers or []),
    }
    asyncio.run(app(scope, receive, collect))
    return b"".join(got)


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[ServedPathsGuard, FakeVllm]]:
    _guard_env(monkeypatch)

    def make(answer: Any = None) -> tuple[ServedPathsGuard, FakeVllm]:
        vllm = FakeVllm(answer)
        return ServedPathsGuard(vllm), vllm

    return make


def tokens(client: str) -> tuple[float, float]:
    """(prompt, completion) counted for ``client`` so far."""
    return tuple(  # type: ignore[return-value]
        REGISTRY.get_sample_value("gemma_rig_client_tokens_total", {"client": client, "kind": kind}) or 0.0
        for kind in ("prompt", "completion")
    )


def named(name: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"x-gemma-rig-client", name)]


STREAMS = [
    ("/v1/chat/completions", {"model": MODEL, "messages": [], "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 3], "stream": True, "n": 1}),
]


@pytest.mark.parametrize("path,body", STREAMS, ids=["chat", "completion", "token-prompt"])
@pytest.mark.parametrize("split", [0, 3], ids=["whole", "split-request"])
def test_a_stream_is_counted_and_the_client_gets_the_stream_it_asked_for(guarded, path, body, split) -> None:
    guard, vllm = guarded()
    before = tokens("alice")
    got = run(guard, body, path, named(b"alice"), split=split)
    assert got == b"".join(_chunks(body, path))  # fingerprint on the last choice chunk, no usage chunk
    assert f'"system_fingerprint":"{FINGERPRINT}"'.encode() in got and b'"usage"' not in got
    assert tokens("alice") == (before[0] + 7, before[1] + 3)
    # vLLM read the request with include_usage added, and a content-length that fits it
    _, raw, headers = vllm.requests[-1]
    assert json.loads(raw) == {**body, "stream_options": {"include_usage": True}}
    assert headers["content-length"] == str(len(raw))


@pytest.mark.parametrize(
    "options,counted",
    [
        ({"include_usage": True}, True),
        ({"include_usage": True, "continuous_usage_stats": True}, True),
        ({"include_usage": False}, False),
        ({"continuous_usage_stats": True}, False),
        (None, False),
    ],
    ids=["usage", "continuous", "no-usage", "continuous-only", "null"],
)
def test_a_stream_with_options_of_its_own_passes_untouched(guarded, options, counted: bool) -> None:
    """The client's own stream_options are never changed: counted when its stream carries usage
    (once, from the last chunk, even with usage on every chunk), else not at all."""
    guard, vllm = guarded()
    body = {"messages": [], "stream": True, "stream_options": options}
    before = tokens("bob")
    assert run(guard, body, headers=named(b"bob")) == b"".join(_chunks(body, "/v1/chat/completions"))
    assert json.loads(vllm.requests[-1][1]) == body
    assert tokens("bob") == ((before[0] + 7, before[1] + 3) if counted else before)


@pytest.mark.parametrize(
    "extra",
    [{"n": 2}, {"best_of": 3}],
    ids=["n2", "best_of"],
)
def test_a_stream_of_several_answers_is_not_changed(guarded, extra: dict) -> None:
    guard, vllm = guarded()
    body = {"messages": [], "stream": True, **extra}
    before = tokens("carol")
    assert run(guard, body, headers=named(b"carol")) == b"".join(_chunks(body, "/v1/chat/completions"))
    assert json.loads(vllm.requests[-1][1]) == body and tokens("carol") == before


def test_several_prompts_are_not_changed(guarded) -> None:
    guard, vllm = guarded()
    body = {"prompt": ["a", "b"], "stream": True}
    run(guard, body, "/v1/completions", named(b"carol"))
    assert json.loads(vllm.requests[-1][1]) == body


def test_a_json_answer_is_counted(guarded) -> None:
    guard, _ = guarded()
    before = tokens("dave")
    run(guard, {"messages": []}, headers=named(b"dave"))
    run(guard, {"prompt": "x"}, "/v1/completions", named(b"dave"))
    assert tokens("dave") == (before[0] + 10, before[1] + 4)


@pytest.mark.parametrize(
    "header,label",
    [
        (named(b"alice.b-2_x"), "alice.b-2_x"),
        (named(b"al\nice"), "invalid"),
        (named(b'al"ice'), "invalid"),
        (named(b"-dash"), "invalid"),
        (named(b"a" * 65), "invalid"),
        (named(b"alice\n"), "invalid"),
        (named(b"\xff\xfe"), "invalid"),
        (named(b""), "invalid"),
        (named(b"alice") + named(b"bob"), "invalid"),
        ([], "direct"),
    ],
    ids=["plain", "newline", "quote", "dash", "long", "trailing-newline", "bytes", "empty", "two", "none"],
)
def test_the_client_label_is_a_plain_name_or_a_fixed_word(guarded, header, label: str) -> None:
    guard, _ = guarded()
    before = tokens(label)
    run(guard, {"messages": []}, headers=header)
    assert tokens(label) == (before[0] + 5, before[1] + 2)


def usage_answer(value: Any) -> Callable[[dict, str], tuple[str, list[bytes]]]:
    return lambda body, path: ("application/json", [json.dumps({"choices": [], "usage": value}).encode()])


@pytest.mark.parametrize(
    "value",
    [
        {"prompt_tokens": "5", "completion_tokens": 2},
        {"prompt_tokens": 5.5, "completion_tokens": 2},
        {"prompt_tokens": True, "completion_tokens": 2},
        {"prompt_tokens": -1, "completion_tokens": 2},
        {"prompt_tokens": 10**40, "completion_tokens": 2},
        {"prompt_tokens": 5},
        [5, 2],
        "5",
        None,
    ],
    ids=["string", "float", "bool", "negative", "huge", "missing", "list", "text", "null"],
)
def test_a_usage_that_is_not_numbers_is_not_counted(guarded, value: Any) -> None:
    guard, _ = guarded(usage_answer(value))
    before = tokens("erin")
    got = run(guard, {"messages": []}, headers=named(b"erin"))
    assert got == json.dumps({"choices": [], "usage": value}).encode() and tokens("erin") == before


GARBAGE = [
    [b"not json at all"],
    [b'{"usage": {"prompt_tokens": 1', b", broken"],
    [b"\xff\xfe\x00garbage"],
    [b"[" * 100000 + b"]" * 100000],  # deeper than json's recursion limit
]


@pytest.mark.parametrize("parts", GARBAGE, ids=["text", "truncated", "bytes", "deep"])
def test_a_malformed_json_answer_passes_unchanged(guarded, parts: list[bytes]) -> None:
    guard, _ = guarded(lambda body, path: ("application/json", parts))
    before = tokens("erin")
    assert run(guard, {"messages": []}, headers=named(b"erin")) == b"".join(parts)
    assert tokens("erin") == before


SSE_GARBAGE = [
    [b"data: {not json}\n\n", b"data: [DONE]\n\n"],
    [b"data: " + b"x" * (usage.MAX_EVENT + 10)],  # one event past the limit, never ended
    [
        b"data: " + b"x" * (usage.MAX_EVENT + 10) + b"\n\n",
        b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n',
    ],
    [b'data: {"choices":[{"finish_reason":"stop"}]}\n\n', b"\xff\xfe\n\n", b"data: [DONE]"],
    [b'data: {"choices":[],"usage":{"prompt_tokens":"a","completion_tokens":[]}}\n\n'],
    [b'data: {"choices":[{"finish_reason":"stop"}]}\n\n'],  # the usage chunk never came
    [b": keep-alive\n\n", b"event: x\r\n\r\ndata: 1\n\n"],
]


@pytest.mark.parametrize(
    "parts",
    SSE_GARBAGE,
    ids=["bad-json", "huge", "huge-then-usage", "bytes", "usage-text", "no-usage", "other-events"],
)
@pytest.mark.parametrize("stream_options", [None, {"include_usage": True}], ids=["added", "own"])
def test_a_garbled_stream_reaches_the_client_byte_for_byte(guarded, parts, stream_options) -> None:
    """Whatever a stream holds, the client gets every byte of it in order, but for a usage-only
    chunk when the guard asked for usage itself (that one is its own); nothing is counted from
    what is not a usage chunk of numbers."""
    guard, _ = guarded(lambda body, path: ("text/event-stream", parts))
    body = {"messages": [], "stream": True}
    if stream_options:
        body["stream_options"] = stream_options
    ours = b'data: {"choices":[],"usage"'
    expected = [p for p in parts if not (stream_options is None and p.startswith(ours))]
    before = tokens("frank")
    assert run(guard, body, headers=named(b"frank")) == b"".join(expected)
    assert tokens("frank") == before


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_answers_split_or_merged_across_messages_are_followed(guarded, stream: bool) -> None:
    """vLLM sends one event per message; the guard does not rely on it."""
    body = {"messages": [], "stream": stream}
    whole = (
        b"".join(_chunks({**body, "stream_options": {"include_usage": True}}, "/v1/chat/completions"))
        if stream
        else json.dumps({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 9}}).encode()
    )
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    ctype = "text/event-stream" if stream else "application/json"
    guard, _ = guarded(lambda b, p: (ctype, pieces))
    before = tokens("gina")
    got = run(guard, body, headers=named(b"gina"))
    if stream:
        assert got == b"".join(_chunks(body, "/v1/chat/completions"))
        assert tokens("gina") == (before[0] + 7, before[1] + 3)
    else:
        assert got == whole and tokens("gina") == (before[0] + 4, before[1] + 9)


def test_a_client_gone_midway_is_vllms_to_handle_and_counts_nothing(guarded) -> None:
    """The client's connection breaks on the second chunk: the error reaches vLLM as it would
    without the guard, and a stream that never finished counts nothing."""
    guard, _ = guarded()
    sent = []

    async def breaking(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append(message["body"])
            if len(sent) == 2:
                raise OSError("client gone")

    before = tokens("hank")
    with pytest.raises(OSError, match="client gone"):
        run(guard, {"messages": [], "stream": True}, headers=named(b"hank"), send=breaking)
    assert tokens("hank") == before


def test_a_request_too_large_to_hold_is_passed_on_as_it_came(guarded, monkeypatch) -> None:
    monkeypatch.setattr(usage, "MAX_REQUEST", 64)
    guard, vllm = guarded()
    body = {"messages": [{"role": "user", "content": "x" * 200}], "stream": True}
    got = run(guard, body, headers=named(b"ivy"), split=10)
    assert json.loads(vllm.requests[-1][1]) == body  # not changed
    assert got == b"".join(_chunks(body, "/v1/chat/completions"))


def test_a_request_that_is_no_json_object_is_passed_on(guarded) -> None:
    guard, vllm = guarded(lambda b, p: ("application/json", [b"{}"]))
    for raw in [
        b"not json",
        b'["stream", true]',
        b"\xef\xbb\xbf{}",
        json.dumps({"stream": True}).encode("utf-16"),
    ]:
        with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
            run(guard, raw, headers=named(b"ivy"))  # the stand-in's own parse may fail: it got raw
        assert vllm.requests[-1][1] == raw


def test_other_paths_are_not_read(guarded) -> None:
    """Only the two completion paths go through the counter: another served path's body is vLLM's alone."""
    guard, vllm = guarded(
        lambda b, p: ("application/json", [b'{"usage":{"prompt_tokens":1,"completion_tokens":1}}'])
    )
    before = tokens("jack")
    run(guard, {"stream": True}, "/v1/models", named(b"jack"))  # a POST: refused by the guard itself
    assert not vllm.requests and tokens("jack") == before


def test_the_filesystems_are_read_at_each_scrape(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GEMMA_RIG_DATA_DIR", str(tmp_path))
    assert filesystem.watched_paths() == [str(tmp_path), "/"]
    monkeypatch.delenv("GEMMA_RIG_DATA_DIR")
    monkeypatch.setenv("HOME", "/opt1/home")  # the unit's HOME=<data dir>/home
    assert filesystem.watched_paths() == ["/opt1", "/"]
    monkeypatch.setenv("HOME", "relative")
    assert filesystem.watched_paths() == ["/"]
    gone = tmp_path / "gone"
    collector = filesystem.FilesystemCollector([str(tmp_path), str(gone)])
    families = {f.name: {s.labels["path"]: s.value for s in f.samples} for f in collector.collect()}
    st = os.statvfs(tmp_path)
    assert families["gemma_rig_filesystem_size_bytes"] == {str(tmp_path): st.f_blocks * st.f_frsize}
    assert 0 < families["gemma_rig_filesystem_avail_bytes"][str(tmp_path)] <= st.f_blocks * st.f_frsize


def test_vllms_own_metrics_serve_the_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's real app, the guard as its --middleware: GET /metrics (with the key) holds the
    token counts and both filesystems."""
    from starlette.testclient import TestClient

    app = build_vllm_app(monkeypatch)
    run(ServedPathsGuard(FakeVllm()), {"messages": []}, headers=named(b"metrics-check"))
    text = TestClient(app, raise_server_exceptions=False).get("/metrics", headers=BEARER).text
    assert 'gemma_rig_client_tokens_total{client="metrics-check",kind="prompt"} 5.0' in text
    assert 'gemma_rig_filesystem_avail_bytes{path="/"}' in text
    assert 'gemma_rig_filesystem_size_bytes{path="/"}' in text


def test_a_vllm_that_sends_usage_anyway_gets_the_request_as_it_came(guarded, monkeypatch) -> None:
    monkeypatch.setenv("RIG_EXTRA_ARGS", "--enforce-eager --enable-force-include-usage")
    guard, vllm = guarded()
    body = {"messages": [], "stream": True}
    run(guard, body, headers=named(b"kim"))
    assert json.loads(vllm.requests[-1][1]) == body


def test_a_chunked_request_gets_no_content_length(guarded) -> None:
    """A request sent without Content-Length (chunked) reaches vLLM without one after the rewrite."""
    guard, vllm = guarded()
    run(guard, {"messages": [], "stream": True}, headers=named(b"lee"), split=5, length=False)
    _, raw, headers = vllm.requests[-1]
    assert "content-length" not in headers and json.loads(raw)["stream_options"] == {"include_usage": True}
