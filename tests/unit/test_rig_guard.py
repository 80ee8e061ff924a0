"""The rig's guard (roles/vllm/files/gemma_rig_guard) in vLLM 0.29.0's own app.

vLLM asks for its key only under /v1: ``POST /invocations`` runs a chat completion without one, and
/tokenize, /load, /version... answer anyone. Here vLLM's real ``build_app`` (every task, dev-mode
routes too) is built with ``--middleware`` as the rig's unit passes it, the guard reading the lists
tpu.env gets from inventory/group_vars/all/rig.yml, and every route vLLM registers is asked for,
with and without the key: the documented ones pass the guard with the key, every other is refused
even with it. A real server behind the guard: tests/controller/test_rig_guard_server.py.
"""

from __future__ import annotations

import re
import sys
import typing
from pathlib import Path

import pytest
import yaml
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

ROOT = Path(__file__).resolve().parents[2]
# The guard as the vllm role ships it, importable here without an install (vLLM imports it by name).
GUARD_SRC = ROOT / "roles" / "vllm" / "files" / "gemma_rig_guard"
if str(GUARD_SRC) not in sys.path:
    sys.path.insert(0, str(GUARD_SRC))
RIG_VARS = yaml.safe_load((ROOT / "inventory" / "group_vars" / "all" / "rig.yml").read_text())
KEY = "sk-guard-0123456789abcdef"
SERVED = {tuple(p.split(":", 1)) for p in RIG_VARS["rig_served_paths"]}
OPEN = {tuple(p.split(":", 1)) for p in RIG_VARS["rig_open_paths"]}
BEARER = {"Authorization": f"Bearer {KEY}"}


def _guard_env(monkeypatch: pytest.MonkeyPatch, key: str = KEY) -> None:
    """The environment the unit gives vLLM: tpu.env's lists (as group_vars/all/vllm.yml joins them)."""
    monkeypatch.setenv("GEMMA_RIG_SERVED_PATHS", " ".join(RIG_VARS["rig_served_paths"]))
    monkeypatch.setenv("GEMMA_RIG_OPEN_PATHS", " ".join(RIG_VARS["rig_open_paths"]))
    monkeypatch.setenv("VLLM_API_KEY", key)


def build_vllm_app(mp: pytest.MonkeyPatch):
    """vLLM 0.29.0's app as ``vllm serve`` builds it, with the rig's --middleware, for every task."""
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.tasks import SupportedTask
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    _guard_env(mp)
    mp.setenv("VLLM_SERVER_DEV_MODE", "1")  # the dev routes (/reset_prefix_cache, /sleep...) too
    argv = ["--model", "x", "--middleware", RIG_VARS["rig_guard_middleware"]]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    return build_app(args, typing.get_args(SupportedTask))


@pytest.fixture(scope="module")
def vllm_app():
    with pytest.MonkeyPatch.context() as mp:
        app = build_vllm_app(mp)
        # The middleware stack (the guard's __init__ reads the environment) is built on the first call.
        client = TestClient(app, raise_server_exceptions=False)
        client.get("/health")
        yield app, client


def vllm_routes(app) -> list[tuple[str, str]]:
    """Every (method, path) the app registers; a path parameter becomes ``x``."""
    pairs = []
    for route in app.routes:
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        if isinstance(route, WebSocketRoute):
            pairs.append(("WEBSOCKET", path))
        elif isinstance(route, Mount):
            pairs += [("GET", path + "/"), ("GET", path + "/x")]
        elif isinstance(route, Route):
            pairs += [(m, path) for m in sorted(route.methods or ())]
    return sorted(set(pairs))


def refused_by_guard(reply) -> bool:
    if reply.request.method == "HEAD":  # no body to read: refused is a 404 or 401 with the guard's length
        return reply.status_code in (401, 404) and reply.headers.get("content-length", "0") != "0"
    try:
        return reply.json()["error"]["type"] == "gemma_rig_guard"
    except (ValueError, KeyError, TypeError):
        return False


def test_vllm_registers_the_paths_the_finding_names(vllm_app) -> None:
    # The enumeration is real: the open paths of the finding are in vLLM's own table.
    paths = {p for _, p in vllm_routes(vllm_app[0])}
    assert {"/invocations", "/tokenize", "/detokenize", "/version", "/load", "/ping"} <= paths
    assert {p for _, p in SERVED} <= paths


def test_every_route_is_served_with_the_key_or_refused(vllm_app) -> None:
    app, client = vllm_app
    wrong = []
    for method, path in vllm_routes(app):
        if method == "WEBSOCKET":
            for headers in ({}, BEARER):
                with (
                    pytest.raises(WebSocketDisconnect),
                    client.websocket_connect(path, headers=headers) as ws,
                ):
                    ws.receive_text()
            continue
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]} if method == "POST" else None
        bare = client.request(method, path, json=body)
        keyed = client.request(method, path, json=body, headers=BEARER)
        if (method, path) in SERVED:
            ok = not refused_by_guard(keyed) and (
                not refused_by_guard(bare) if (method, path) in OPEN else bare.status_code == 401
            )
        else:
            ok = bare.status_code == 404 and refused_by_guard(bare) and keyed.status_code == 404
            ok = (
                ok
                and refused_by_guard(keyed)
                and (method == "HEAD" or path in keyed.json()["error"]["message"])
            )
        if not ok:
            wrong.append(f"{method} {path}: {bare.status_code} without the key, {keyed.status_code} with it")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/invocations"),
        ("POST", "//invocations"),
        ("POST", "/v1/../invocations"),
        ("POST", "/v1/chat/completions/../../invocations"),
        ("POST", "/v1/%2e%2e/tokenize"),
        ("POST", "/v1/chat/completions/"),
        ("POST", "/V1/chat/completions"),
        ("GET", "//v1/models"),
        ("GET", "/v1/models/"),
        ("HEAD", "/health"),
        ("OPTIONS", "/v1/chat/completions"),
        ("GET", "/metrics/"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
    ],
)
def test_hostile_paths_are_refused_even_with_the_key(vllm_app, method: str, path: str) -> None:
    reply = vllm_app[1].request(method, path, headers=BEARER)
    assert reply.status_code == 404 and refused_by_guard(reply), (reply.status_code, reply.text)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": f"Bearer {KEY[:-1]}"},
        {"Authorization": f"Bearer  {KEY}"},
        {"Authorization": f"Bearer {KEY.upper()}"},
    ],
)
@pytest.mark.parametrize("path", ["/v1/models", "/metrics"])
def test_a_missing_or_wrong_key_is_401(vllm_app, headers: dict, path: str) -> None:
    reply = vllm_app[1].get(path, headers=headers)
    assert reply.status_code == 401 and refused_by_guard(reply), (reply.status_code, reply.text)
    assert KEY not in reply.text


def test_two_authorization_headers_are_refused(vllm_app) -> None:
    reply = vllm_app[1].get(
        "/v1/models", headers=[("authorization", "Bearer wrong"), ("authorization", BEARER["Authorization"])]
    )
    assert reply.status_code == 401


def test_a_hostile_path_is_echoed_as_json_data(vllm_app) -> None:
    path = '/x"}<script>' + "a" * 500
    reply = vllm_app[1].get(path, headers=BEARER)
    assert reply.status_code == 404 and reply.headers["content-type"] == "application/json"
    assert reply.json()["error"]["message"].startswith('GET /x"}<script>') and len(reply.text) < 400


@pytest.mark.parametrize(
    "served,open_,error",
    [
        (None, "", "unset or empty"),
        ("", "", "unset or empty"),
        ("GET /health", "", "is not METHOD:/path"),
        ("GET:health", "", "is not METHOD:/path"),
        ("GET:/v1/../tokenize", "", "is not METHOD:/path"),
        ("GET:/health", "POST:/invocations", "does not serve"),
    ],
)
def test_bad_lists_stop_the_start(monkeypatch: pytest.MonkeyPatch, served, open_, error) -> None:
    from gemma_rig_guard import ServedPathsGuard

    if served is None:
        monkeypatch.delenv("GEMMA_RIG_SERVED_PATHS", raising=False)
    else:
        monkeypatch.setenv("GEMMA_RIG_SERVED_PATHS", served)
    monkeypatch.setenv("GEMMA_RIG_OPEN_PATHS", open_)
    with pytest.raises(ValueError, match=error):
        ServedPathsGuard(lambda *a: None)


def test_without_a_key_the_served_paths_need_none(monkeypatch: pytest.MonkeyPatch) -> None:
    # A loopback-only rig has no key: the guard still refuses every undocumented path.
    from gemma_rig_guard import ServedPathsGuard
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse

    _guard_env(monkeypatch, key="")

    async def ok(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/models", ok), Route("/tokenize", ok, methods=["POST"])])
    app.add_middleware(ServedPathsGuard)
    client = TestClient(app)
    assert client.get("/v1/models").text == "ok"
    assert client.post("/tokenize").status_code == 404
