"""MCP over HTTP: real clients against the real server process. The server never serves HTTP
without a bearer token, loopback included (it refuses to start, in one line); without the token,
or with a wrong one, nothing answers (401) and no tool runs; a foreign Host is refused; off
loopback it speaks TLS only, with a certificate it is given or one it makes (and keeps while its
names fit), or it refuses to start and names the SSH tunnel.

"Off loopback" here is the wildcard address (0.0.0.0): the server is not on loopback alone, but
every request the tests make goes to 127.0.0.1, so no traffic leaves this machine."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from rig_mcp.http_guard import StartRefused, Tls, cert_names, self_signed
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
NO_TOKEN = (
    "rig_mcp: --http needs a bearer token, loopback included: give --token-file FILE "
    "(made 0600 with a random token when FILE does not exist) or RIG_MCP_TOKEN"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RIG_MCP_TOKEN"}
    return {**env, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), **extra}


@dataclass
class Served:
    port: int
    stderr: Path

    def said(self) -> str:
        return self.stderr.read_text()


@contextmanager
def serving(args: list[str], env: dict[str, str], tmp_path: Path) -> Iterator[Served]:
    """python -m rig_mcp --http on a free port, until it listens on 127.0.0.1 (a loopback bind, or
    the wildcard one); its stderr goes to a file, read with ``said()``."""
    port = free_port()
    stderr = tmp_path / f"server-{port}.err"
    with stderr.open("w") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "rig_mcp", "--read-only", "--http", "--port", str(port), *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, f"the server exited: {stderr.read_text()}"
            time.sleep(0.1)
        yield Served(port, stderr)
    finally:
        server.terminate()
        server.wait(timeout=30)


def post(port: int, headers: dict[str, str], body: dict[str, Any] = INIT) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/mcp", headers={**HEADERS, **headers}, content=json.dumps(body), timeout=30
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def call(url: str, token: str, tool: str, verify: ssl.SSLContext | bool = True) -> tuple[set[str], Any]:
    """The SDK's streamable HTTP client at ``url``: the tools listed, and ``tool``'s result."""

    async def go() -> tuple[set[str], Any]:
        # Closed when done, as a client should: an abandoned TLS connection holds the server's
        # shutdown until its TLS close times out.
        async with (
            httpx2.AsyncClient(headers=bearer(token), verify=verify, timeout=120) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            names = {t.name for t in (await client.list_tools()).tools}
            return names, await client.call_tool(tool, {})

    return anyio.run(go)


def list_tools(port: int, token: str) -> set[str]:
    return call(f"http://127.0.0.1:{port}/mcp", token, "list_models")[0]


def token_file(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "mcp.token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def start_refused(args: list[str], env: dict[str, str], port: int | None = None) -> str:
    """The server's one line when it refuses to start (exit 2, nothing listening)."""
    done = subprocess.run(
        [sys.executable, "-m", "rig_mcp", "--read-only", "--http", "--port", str(port or free_port()), *args],
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


# --- the token -------------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_without_a_token_the_server_refuses_to_start_loopback_included(tmp_path: Path, host: str) -> None:
    env = server_env(tmp_path)
    assert start_refused(["--host", host], env) == NO_TOKEN
    # The old opt-in is still accepted, and changes nothing: the token is required either way.
    assert start_refused(["--host", host, "--require-token"], env) == NO_TOKEN
    # An empty RIG_MCP_TOKEN is no token.
    assert start_refused(["--host", host], {**env, "RIG_MCP_TOKEN": " "}) == NO_TOKEN


def inventory_script(tmp_path: Path) -> tuple[Path, Path]:
    """An inventory script that leaves a mark each time it runs: a tool that reads the inventory
    (list_rigs) runs it, so the mark says whether a tool ran."""
    mark = tmp_path / "a-tool-ran"
    script = tmp_path / "inventory.py"
    inventory = {"rigs": {"hosts": ["rig-marked"]}, "_meta": {"hostvars": {}}}
    script.write_text(
        f"#!{sys.executable}\nimport pathlib\n"
        f"pathlib.Path({str(mark)!r}).touch()\nprint({json.dumps(json.dumps(inventory))})\n"
    )
    script.chmod(0o700)
    return script, mark


def test_the_token_file_guards_every_request_and_no_tool_runs_without_it(tmp_path: Path) -> None:
    script, mark = inventory_script(tmp_path)
    args = ["--token-file", str(token_file(tmp_path)), "-i", str(script)]
    with serving(args, server_env(tmp_path), tmp_path) as served:
        port = served.port
        assert post(port, {}).status_code == 401
        assert post(port, bearer("wrong-token-wrong-token")).status_code == 401
        assert post(port, {"Authorization": TOKEN}).status_code == 401  # not a bearer token
        assert post(port, bearer(TOKEN[:-1])).status_code == 401  # a prefix of it
        assert post(port, bearer(TOKEN + "x")).status_code == 401
        # A session opened with the token: a tool call on it without the token, or with a wrong
        # one, is refused before the tool runs (the inventory script leaves no mark).
        opened = post(port, bearer(TOKEN))
        assert opened.status_code == 200
        session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-06-18"}
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert post(port, {**session, **bearer(TOKEN)}, done).status_code == 202
        tool = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "list_rigs", "arguments": {}},
        }
        for headers in ({}, bearer("wrong-token-wrong-token"), {"Authorization": f"Basic {TOKEN}"}):
            refused = post(port, {**session, **headers}, tool)
            assert refused.status_code == 401, refused.text
            assert "rig-marked" not in refused.text
        assert not mark.exists(), "a tool ran for a request without the token"
        # The same call with the token runs the tool (the mark shows the check above can see it).
        answered = post(port, {**session, **bearer(TOKEN)}, tool)
        assert answered.status_code == 200 and "rig-marked" in answered.text, answered.text
        assert mark.exists()
        # A Host header of another name (DNS rebinding) is refused even with the token.
        foreign = post(port, {**bearer(TOKEN), "Host": f"evil.example:{port}"})
        assert foreign.status_code == 421
        origin = post(port, {**bearer(TOKEN), "Origin": "http://evil.example"})
        assert origin.status_code == 403
        assert "list_rigs" in list_tools(port, TOKEN)


def test_the_token_from_the_environment_and_an_allowed_host(tmp_path: Path) -> None:
    args = ["--allowed-host", "rig-mcp.internal:*"]
    with serving(args, server_env(tmp_path, RIG_MCP_TOKEN=TOKEN), tmp_path) as served:
        assert post(served.port, {}).status_code == 401
        assert (
            post(served.port, {**bearer(TOKEN), "Host": f"rig-mcp.internal:{served.port}"}).status_code == 200
        )


def test_a_token_file_that_does_not_exist_is_made_private_and_random(tmp_path: Path) -> None:
    path = tmp_path / "config" / "gemma-rig" / "mcp.token"
    with serving(["--token-file", str(path)], server_env(tmp_path), tmp_path) as served:
        st = path.stat()
        assert (st.st_uid, st.st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (
            os.geteuid(),
            0o600,
            0o700,
        )
        token = path.read_text().strip()
        assert len(token) >= 32
        said = served.said()
        assert f"rig_mcp: made --token-file {path} (mode 0600, a new random token)" in said
        assert token not in said  # the path is printed, never the token
        assert post(served.port, {}).status_code == 401
        assert "list_rigs" in list_tools(served.port, token)
    # A second start reads the same file: the token clients were given still works.
    with serving(["--token-file", str(path)], server_env(tmp_path), tmp_path) as served:
        assert "made --token-file" not in served.said()
        assert path.read_text().strip() == token
        assert post(served.port, bearer(token)).status_code == 200


def test_an_unsafe_token_file_is_refused(tmp_path: Path) -> None:
    env = server_env(tmp_path)
    assert "readable by others (mode 0644)" in start_refused(
        ["--token-file", str(token_file(tmp_path, 0o644))], env
    )
    link = tmp_path / "link.token"
    link.symlink_to(token_file(tmp_path))
    assert "a symlink is refused" in start_refused(["--token-file", str(link)], env)
    # A dangling symlink is not "missing": it is refused, never written through.
    dangling = tmp_path / "dangling.token"
    dangling.symlink_to(tmp_path / "elsewhere.token")
    assert "a symlink is refused" in start_refused(["--token-file", str(dangling)], env)
    assert not (tmp_path / "elsewhere.token").exists()
    other = token_file(tmp_path)
    os.chown(other, 4242, 4242)
    assert "owned by uid 4242" in start_refused(["--token-file", str(other)], env)
    short = tmp_path / "short.token"
    short.write_text("too-short\n")
    short.chmod(0o600)
    assert "no token of 16 characters" in start_refused(["--token-file", str(short)], env)


# --- TLS off loopback -------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_off_loopback_without_tls_the_server_refuses_naming_the_tunnel(tmp_path: Path, host: str) -> None:
    port = free_port()
    line = start_refused(
        ["--host", host, "--token-file", str(token_file(tmp_path))], server_env(tmp_path), port
    )
    assert line.startswith(f"rig_mcp: --host {host} is not loopback"), line
    assert "--tls-cert FILE --tls-key FILE" in line and "--tls self-signed" in line
    assert f"ssh -N -L {port}:127.0.0.1:{port} " in line, line
    # No token file is made behind a refusal.
    fresh = tmp_path / "fresh.token"
    start_refused(["--host", host, "--token-file", str(fresh)], server_env(tmp_path))
    assert not fresh.exists()


def certificate(directory: Path, names: list[str], days: int = 30) -> tuple[Path, Path, str]:
    """A self-signed server certificate for ``names`` and its key (0600), made here, not by the
    product; and its SHA-256 fingerprint as the server prints it."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    sans = [x509.IPAddress(ipaddress.ip_address(n)) for n in names]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path, cert.fingerprint(hashes.SHA256()).hex(":").upper()


def plain_http_gets_no_result(port: int) -> None:
    """A plain-HTTP request to the TLS port, token and all: no answer at all (the TLS handshake
    fails on it), so never a tool result."""
    tool = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "list_rigs", "arguments": {}},
    }
    for body in (INIT, tool):
        try:
            got = post(port, bearer(TOKEN), body)
        except httpx.TransportError:
            continue
        assert got.status_code >= 400 and '"result"' not in got.text, got.text


def test_off_loopback_with_a_given_certificate_it_serves_tls_only(tmp_path: Path) -> None:
    cert, key, pin = certificate(tmp_path / "tls", ["127.0.0.1"])
    args = [
        "--host",
        "0.0.0.0",
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--token-file",
        str(token_file(tmp_path)),
    ]
    with serving(args, server_env(tmp_path), tmp_path) as served:
        assert f"rig_mcp: TLS certificate {cert} (given), SHA-256 fingerprint {pin}" in served.said()
        assert f"serving https://0.0.0.0:{served.port}/mcp" in served.said()
        url = f"https://127.0.0.1:{served.port}/mcp"
        names, result = call(url, TOKEN, "list_rigs", ssl.create_default_context(cafile=cert))
        assert "list_rigs" in names
        assert not result.is_error, result.content[0].text
        assert [r["rig"] for r in result.structured_content["result"]] == ["rig-local"]
        plain_http_gets_no_result(served.port)
        # A client that does not trust the certificate gets no connection.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.post(url, headers={**HEADERS, **bearer(TOKEN)}, content=json.dumps(INIT), timeout=30)
        # Over TLS the token is still checked.
        ctx = ssl.create_default_context(cafile=cert)
        assert (
            httpx.post(url, headers=HEADERS, content=json.dumps(INIT), verify=ctx, timeout=30).status_code
            == 401
        )


def test_a_given_certificate_is_checked_before_the_server_starts(tmp_path: Path) -> None:
    env = server_env(tmp_path)
    cert, key, _ = certificate(tmp_path / "a", ["127.0.0.1"])
    other_cert, _, _ = certificate(tmp_path / "b", ["127.0.0.1"])
    base = ["--host", "0.0.0.0", "--token-file", str(token_file(tmp_path))]
    assert "cannot serve TLS" in start_refused(
        [*base, "--tls-cert", str(other_cert), "--tls-key", str(key)], env
    )
    assert "go together" in start_refused([*base, "--tls-cert", str(cert)], env)
    # TLS does not stand in for the token.
    assert (
        start_refused(["--host", "0.0.0.0", "--tls-cert", str(cert), "--tls-key", str(key)], env) == NO_TOKEN
    )
    key.chmod(0o640)
    assert "--tls-key" in start_refused([*base, "--tls-cert", str(cert), "--tls-key", str(key)], env)
    expired, expired_key, _ = certificate(tmp_path / "c", ["127.0.0.1"], days=-1)
    assert "not now" in start_refused([*base, "--tls-cert", str(expired), "--tls-key", str(expired_key)], env)


def made_certificate(said: str) -> tuple[str, str]:
    """How the server came by its certificate ("made", "reused") and its fingerprint."""
    found = re.search(
        r"TLS certificate \S+ \((made|reused)\), SHA-256 fingerprint ([0-9A-F:]{95})$", said, re.M
    )
    assert found, said
    return found[1], found[2]


def san_names(cert: Path) -> set[str]:
    sans = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    return {str(v) for v in sans.value.get_values_for_type(x509.IPAddress)} | set(
        sans.value.get_values_for_type(x509.DNSName)
    )


def test_a_self_signed_certificate_is_made_once_kept_and_remade_when_its_names_change(tmp_path: Path) -> None:
    env = server_env(tmp_path)
    state = tmp_path / ".cache" / "gemma-rig" / "mcp-tls"
    cert = state / "cert.pem"
    base = ["--host", "0.0.0.0", "--tls", "self-signed", "--token-file", str(token_file(tmp_path))]
    with serving([*base, "--allowed-host", "rig-mcp.test:*"], env, tmp_path) as served:
        how, first = made_certificate(served.said())
        assert how == "made"
        assert (state.stat().st_mode & 0o777, (state / "key.pem").stat().st_mode & 0o777) == (0o700, 0o600)
        assert san_names(cert) == {"127.0.0.1", "::1", "localhost", "rig-mcp.test"}
        assert x509.load_pem_x509_certificate(cert.read_bytes()).public_key().curve.name == "secp256r1"
        # A client that pins the made certificate (its CA file) calls a tool over TLS.
        ctx = ssl.create_default_context(cafile=cert)
        _, result = call(f"https://127.0.0.1:{served.port}/mcp", TOKEN, "list_models", ctx)
        assert not result.is_error, result.content[0].text
        plain_http_gets_no_result(served.port)
    with serving([*base, "--allowed-host", "rig-mcp.test:*"], env, tmp_path) as served:
        assert made_certificate(served.said()) == ("reused", first)
    with serving([*base, "--allowed-host", "other.test:8765"], env, tmp_path) as served:
        how, second = made_certificate(served.said())
        assert how == "made" and second != first
        assert san_names(cert) == {"127.0.0.1", "::1", "localhost", "other.test"}


def test_a_self_signed_certificate_near_its_end_or_tampered_with_is_made_again(tmp_path: Path) -> None:
    names = ["127.0.0.1", "localhost"]
    now = datetime.datetime.now(datetime.UTC)
    made = self_signed(tmp_path / "tls", names, now)
    assert made.how == "made"
    assert self_signed(tmp_path / "tls", names, now + datetime.timedelta(days=300)) == (
        Tls(made.cert, made.key, made.fingerprint, "reused")
    )
    again = self_signed(tmp_path / "tls", names, now + datetime.timedelta(days=340))
    assert again.how == "made" and again.fingerprint != made.fingerprint
    # A key others can read is not served again.
    again.key.chmod(0o644)
    third = self_signed(tmp_path / "tls", names, now + datetime.timedelta(days=340))
    assert third.how == "made" and (third.key.stat().st_mode & 0o777) == 0o600
    # A name a certificate cannot carry (from --allowed-host, the caller's text) is one line.
    with pytest.raises(StartRefused, match="is not a host name a certificate can carry"):
        self_signed(tmp_path / "tls", cert_names("0.0.0.0", ["\u00e9vil.test:*", "rig.test:*"]), now)
    # A state folder another user could write is refused, not used.
    (tmp_path / "tls").chmod(0o777)
    with pytest.raises(StartRefused, match=r"TLS state directory .* is writable by others"):
        self_signed(tmp_path / "tls", names, now)
