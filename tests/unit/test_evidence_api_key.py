"""The bench and accuracy clients read vLLM's key from tpu.env and send it as a bearer token."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "roles" / "bench" / "files"))
sys.path.insert(0, str(ROOT / "roles" / "accuracy" / "files"))
import accuracy  # the roles' clients, copied to the rig as plain files
import bench

KEY = 'sk-"quoted"\\and-long-0123'


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """A /v1/models that answers 200 only with the right bearer token (as vLLM with VLLM_API_KEY)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # http.server's naming
            auth = self.headers.get("Authorization", "")
            seen.append(auth)
            ok = auth == f"Bearer {KEY}"
            body = json.dumps(
                {"data": [{"id": "m", "max_model_len": 64}]} if ok else {"error": "Unauthorized"}
            )
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def env_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tpu.env"
    path.write_text(text)
    return path


@pytest.mark.parametrize("client", [bench, accuracy])
def test_reads_the_key_as_rig_config_writes_it(tmp_path: Path, client) -> None:
    # rig_config quotes a value holding quotes or backslashes (systemd EnvironmentFile syntax).
    path = env_file(tmp_path, 'RIG_PORT=8000\nVLLM_API_KEY="sk-\\"quoted\\"\\\\and-long-0123"\nHF_HOME=/x\n')
    assert client.api_key_from_env_file(path) == KEY
    assert client.api_key_from_env_file(env_file(tmp_path, "VLLM_API_KEY=plain-key-0123456789\n")) == (
        "plain-key-0123456789"
    )
    assert client.api_key_from_env_file(env_file(tmp_path, "RIG_PORT=8000\n")) == ""


def test_clients_send_the_key_only_when_given(
    tmp_path: Path, server, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = server
    with pytest.raises(bench.BenchError, match="HTTP 401"):
        bench.discover(url)
    with pytest.raises(accuracy.AccuracyError, match="cannot list models"):
        accuracy.discover_model(url)
    monkeypatch.setitem(bench.AUTH_HEADERS, "Authorization", f"Bearer {KEY}")
    monkeypatch.setitem(accuracy.AUTH_HEADERS, "Authorization", f"Bearer {KEY}")
    assert bench.discover(url)["model"] == "m"
    assert accuracy.discover_model(url) == "m"
    assert seen == ["", "", f"Bearer {KEY}", f"Bearer {KEY}"]


def test_bench_cli_takes_the_key_from_the_file(
    tmp_path: Path, server, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = server
    monkeypatch.setattr(bench, "AUTH_HEADERS", {})
    path = env_file(tmp_path, 'VLLM_API_KEY="sk-\\"quoted\\"\\\\and-long-0123"\n')
    out = tmp_path / "out.json"
    # No sweep, no decode runs: the CLI only discovers the model, which needs the key.
    rc = bench.main(["--url", url, "--vocab-size", "100", "--no-sweep", "--decode-runs", "0",
                     "--api-key-env-file", str(path), "--out", str(out)])  # fmt: skip
    assert rc == 0 and json.loads(out.read_text())["model"] == "m"
    assert seen == [f"Bearer {KEY}"]
