"""MCP over HTTP: a real HTTP client against the real server process. Without the bearer token, or
with a wrong one, nothing answers (401); with it the tools work; a foreign Host is refused; and
the server will not listen off loopback without a token."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.unit.mcp_stack import ROOT

TOKEN = "s3cr3t-token-for-the-rig-mcp-test"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RIG_MCP_TOKEN"}
    return {**env, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), **extra}


@contextmanager
def serving(args: list[str], env: dict[str, str]) -> Iterator[int]:
    """python -m rig_mcp --http on a free loopback port, until it listens; yields the port."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "rig_mcp", "--read-only", "--http", "--port", str(port), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, f"the server exited: {server.stderr.read()}"
            time.sleep(0.1)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def post(port: int, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/mcp", headers={**HEADERS, **headers}, content=json.dumps(INIT), timeout=30
    )


def list_tools(port: int, token: str) -> set[str]:
    async def go() -> set[str]:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client:
            return {t.name for t in (await client.list_tools()).tools}

    return anyio.run(go)


def token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "mcp.token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def test_the_token_file_guards_every_request(tmp_path: Path) -> None:
    with serving(["--token-file", str(token_file(tmp_path))], server_env(tmp_path)) as port:
        assert post(port, {}).status_code == 401
        assert post(port, {"Authorization": "Bearer wrong-token-wrong-token"}).status_code == 401
        assert post(port, {"Authorization": TOKEN}).status_code == 401  # not a bearer token
        assert post(port, {"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert "list_rigs" in list_tools(port, TOKEN)
        # A Host header of another name (DNS rebinding) is refused even with the token.
        foreign = post(port, {"Authorization": f"Bearer {TOKEN}", "Host": f"evil.example:{port}"})
        assert foreign.status_code == 421
        origin = post(port, {"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.example"})
        assert origin.status_code == 403


def test_the_token_from_the_environment_and_an_allowed_host(tmp_path: Path) -> None:
    args = ["--allowed-host", "rig-mcp.internal:*"]
    with serving(args, server_env(tmp_path, RIG_MCP_TOKEN=TOKEN)) as port:
        assert post(port, {}).status_code == 401
        assert (
            post(port, {"Authorization": f"Bearer {TOKEN}", "Host": f"rig-mcp.internal:{port}"}).status_code
            == 200
        )


def start_refused(args: list[str], env: dict[str, str]) -> str:
    """The server's one line when it refuses to start (exit 2, nothing listening)."""
    done = subprocess.run(
        [sys.executable, "-m", "rig_mcp", "--read-only", "--http", "--port", str(free_port()), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_off_loopback_without_a_token_the_server_refuses_to_start(tmp_path: Path, host: str) -> None:
    line = start_refused(["--host", host], server_env(tmp_path))
    assert line == (
        f"rig_mcp: --host {host} is not loopback: give a bearer token with --token-file FILE or RIG_MCP_TOKEN"
    )


def test_an_unsafe_token_file_is_refused(tmp_path: Path) -> None:
    env = server_env(tmp_path)
    assert "readable by others (mode 0644)" in start_refused(
        ["--token-file", str(token_file(tmp_path, 0o644))], env
    )
    link = tmp_path / "link.token"
    link.symlink_to(token_file(tmp_path))
    assert "a symlink is refused" in start_refused(["--token-file", str(link)], env)
    other = token_file(tmp_path)
    os.chown(other, 4242, 4242)
    assert "owned by uid 4242" in start_refused(["--token-file", str(other)], env)
    assert "--require-token" in start_refused(["--require-token"], env)
