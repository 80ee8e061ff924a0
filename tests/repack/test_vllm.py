"""Each build loads and generates in vLLM 0.29.0's CPU build on the controller."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

START_TIMEOUT_S = 900  # a loaded 2-core CI box takes minutes to start vLLM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, body: dict | None = None, timeout: float = 120) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


# (build, extra flags). emb4 needs plugins/vllm_cpu_int4_embedding installed in this venv;
# text-kv is the layout with k_proj/v_proj/k_norm present for the KV-shared layers.
CASES = [
    ("w4a16", ["--language-model-only"]),
    ("text", []),
    ("emb4", []),
    ("w8a8", []),
    ("text-kv", []),
]


@pytest.mark.parametrize(("build", "flags"), CASES, ids=[c[0] for c in CASES])
def test_build_serves_a_chat_completion(builds, build, flags, tmp_path):
    port = _free_port()
    log = tmp_path / "vllm.log"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(builds[build]), "--served-model-name", build,
        "--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20), "--max-model-len", "1024",
        "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port), *flags,
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, log.read_text()[-4000:]
            try:
                if _get(f"http://127.0.0.1:{port}/v1/models", timeout=5)["data"][0]["id"] == build:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "vLLM did not become ready:\n" + log.read_text()[-4000:]
            time.sleep(2)
        body = {
            "model": build,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        r = _get(f"http://127.0.0.1:{port}/v1/chat/completions", body)
        assert r["usage"]["completion_tokens"] == 8, r
        assert r["choices"][0]["finish_reason"] == "length"
        assert isinstance(r["choices"][0]["message"]["content"], str)
        assert proc.poll() is None, "vLLM died after answering:\n" + log.read_text()[-4000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
