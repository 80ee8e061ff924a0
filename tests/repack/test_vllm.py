"""Each build loads and generates in vLLM 0.29.0's CPU build on the controller."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.vllm_server import serve

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
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
    with serve(builds[build], build, tmp_path / "vllm.log", extra_args=flags) as url:
        body = {
            "model": build,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
            "temperature": 0,
        }
        r = _post(f"{url}/v1/chat/completions", body)
        assert r["usage"]["completion_tokens"] == 8, r
        assert r["choices"][0]["finish_reason"] == "length"
        assert isinstance(r["choices"][0]["message"]["content"], str)
