"""The local profile starts vLLM's engine process by fork (roles/vllm/files/vllm_cpu_fork_engine).

The CPU build forces spawn, which imports torch and vLLM a second time in the new process; the
profile's GEMMA_RIG_ENGINE_START=fork makes the plugin put fork back. The servers here get the
profile's environment (tests/vllm_server.py), as the rig's unit does from tpu.env.
"""

from __future__ import annotations

import httpx
import pytest

from tests.vllm_server import RIG_ENV, SERVER_PIDS, engine_forked

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_the_profile_asks_for_fork() -> None:
    assert RIG_ENV.get("GEMMA_RIG_ENGINE_START") == "fork"


def test_each_servers_engine_is_a_fork_and_answers(servers) -> None:
    for served in servers:
        assert engine_forked(SERVER_PIDS[served.url]), f"{served.name}: the engine process was spawned"
        reply = httpx.post(
            f"{served.url}/v1/completions",
            json={"model": served.name, "prompt": "The", "max_tokens": 4, "temperature": 0},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] > 0
