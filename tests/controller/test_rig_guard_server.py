"""A real vLLM CPU server behind the rig's guard, started as the rig's unit starts it.

One server (a random tiny model, evidence/_tiny.py) with the unit's ``--middleware`` and tpu.env's
VLLM_API_KEY and served-path lists (inventory/group_vars/all). Every route vLLM 0.29.0 registers
(its own build_app's table, tests/unit/test_rig_guard.py) is asked for over HTTP, with and without
the key: the documented ones answer with the key, every other is refused even with it. Without the
guard, ``POST /invocations`` here runs a chat completion with no key at all.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from evidence import _tiny
from tests.unit.test_rig_guard import (
    GUARD_SRC,
    KEY,
    OPEN,
    RIG_VARS,
    SERVED,
    build_vllm_app,
    refused_by_guard,
    vllm_routes,
)
from tests.vllm_server import serve

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

NAME = "tiny-guarded"
BEARER = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("guarded-vllm")
    model = _tiny.build(root / NAME, seed=5)
    env = {
        "VLLM_API_KEY": KEY,
        "GEMMA_RIG_SERVED_PATHS": " ".join(RIG_VARS["rig_served_paths"]),
        "GEMMA_RIG_OPEN_PATHS": " ".join(RIG_VARS["rig_open_paths"]),
        "PYTHONPATH": str(GUARD_SRC),  # the role's source, installed or not
    }
    extra = ["--middleware", RIG_VARS["rig_guard_middleware"]]
    with serve(model, NAME, root / "vllm.log", extra_args=extra, env=env) as url:
        yield url


@pytest.fixture(scope="module")
def routes() -> list[tuple[str, str]]:
    with pytest.MonkeyPatch.context() as mp:
        return vllm_routes(build_vllm_app(mp))


def _raw(url: str, method: str, target: str, key: str | None) -> int:
    """One request with its target byte for byte (httpx would resolve `..`); its status."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ).encode()
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    head += f"Authorization: Bearer {key}\r\n" if key else ""
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=120) as conn:
        conn.sendall(head.encode() + body)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


def test_the_documented_paths_answer_with_the_key(guarded: str) -> None:
    with httpx.Client(base_url=guarded, timeout=300) as client:
        assert client.get("/health").status_code == 200  # no key: load balancers and probes
        for path in ("/v1/models", "/metrics"):
            assert client.get(path).status_code == 401
            assert client.get(path, headers=BEARER).status_code == 200
        completion = {"model": NAME, "prompt": "The", "max_tokens": 2}
        assert client.post("/v1/completions", json=completion).status_code == 401
        assert client.post("/v1/completions", json=completion, headers=BEARER).status_code == 200
        chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert client.post("/v1/chat/completions", json=chat).status_code == 401
        reply = client.post("/v1/chat/completions", json=chat, headers=BEARER)
        assert not refused_by_guard(reply), reply.text  # past the guard: vLLM's own answer


def test_every_route_vllm_registers_is_served_or_refused(guarded: str, routes: list[tuple[str, str]]) -> None:
    assert ("POST", "/invocations") in routes and ("POST", "/tokenize") in routes
    wrong = []
    with httpx.Client(base_url=guarded, timeout=300) as client:
        for method, path in routes:
            if method == "WEBSOCKET" or (method, path) in SERVED:
                continue  # the served ones: the test above; a websocket: the unit test
            body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            kwargs = {"json": body} if method == "POST" else {}
            bare = client.request(method, path, **kwargs)
            keyed = client.request(method, path, headers=BEARER, **kwargs)
            if not (bare.status_code == keyed.status_code == 404 and refused_by_guard(keyed)):
                wrong.append(
                    f"{method} {path}: {bare.status_code} without the key, {keyed.status_code} with it"
                )
    assert not wrong, "\n".join(wrong)
    assert {("GET", "/health")} == OPEN


@pytest.mark.parametrize(
    "target",
    ["/invocations", "//invocations", "/v1/../invocations", "/v1/chat/completions/../../invocations",
     "/v1/%2e%2e/tokenize", "/%69nvocations"],
)  # fmt: skip
def test_hostile_spellings_never_reach_vllm(guarded: str, target: str) -> None:
    assert _raw(guarded, "POST", target, None) == 404
    assert _raw(guarded, "POST", target, KEY) == 404


def _events(client: httpx.Client, body: dict, name: str) -> list[dict]:
    headers = {**BEARER, "X-Gemma-Rig-Client": name}
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def _tokens(client: httpx.Client, name: str) -> dict[str, float]:
    text = client.get("/metrics", headers=BEARER).text
    found = {}
    for kind in ("prompt", "completion"):
        prefix = f'gemma_rig_client_tokens_total{{client="{name}",kind="{kind}"}} '
        found[kind] = float(
            next((x for x in text.splitlines() if x.startswith(prefix)), prefix + "0")[len(prefix) :]
        )
    return found


def test_a_stream_is_counted_and_reaches_the_client_as_vllm_sends_it(guarded: str) -> None:
    """Real vLLM: a stream asked without usage keeps vLLM's shape (no usage chunk, the fingerprint
    on the last choice chunk) and is counted like one that asked for usage; /metrics also holds the
    rig's filesystems."""
    # A completion: the tiny model has no chat template.
    chat = {"model": NAME, "prompt": "The", "max_tokens": 3, "stream": True}
    with httpx.Client(base_url=guarded, timeout=300) as client:
        plain = _events(client, chat, "plain")
        asked = _events(client, {**chat, "stream_options": {"include_usage": True}}, "asked")
        assert all("usage" not in e for e in plain)
        assert plain[-1]["choices"][0]["finish_reason"] is not None and plain[-1].get("system_fingerprint")
        assert asked[-1]["choices"] == [] and "system_fingerprint" not in asked[-2]
        usage = asked[-1]["usage"]
        expected = {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"]}
        assert _tokens(client, "asked") == expected and _tokens(client, "plain") == expected
        text = client.get("/metrics", headers=BEARER).text
    assert 'gemma_rig_filesystem_avail_bytes{path="/"}' in text
