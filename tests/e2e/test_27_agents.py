"""An agent through the gateway (docs/agents.md): with the official openai SDK over TLS and an API
key, a tool call comes back parsed, whole and streamed, and a json_schema answer validates, as
from the rig itself (test_05_rig_contract). The gateway stands in front of rig-local alone and is
removed after; the rig is left as it was.
"""

from __future__ import annotations

import json
import ssl

import httpx
import openai
import pytest

from repack import tiny_facts
from tests.ansible_run import run_playbook
from tests.conftest import ROOT
from tests.e2e.agents import (
    assert_calls_the_tool,
    assert_json_schema_answer,
    assert_streamed_call_is_the_same,
)
from tests.e2e.rig import rig_containers

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start

INVENTORY = ("-i", "inventory/local.yml", "-i", str(ROOT / "inventory" / "gateway-local.yml"))
KEY = "sk-agents-e2e-0123456789abcdef"  # a test-only key
URL = "https://127.0.0.1:8443"  # gateway_port, gateway-local's gateway_address
CERT = ROOT / "build" / "gateway" / "gateway-local.crt"  # gateway_controller_dir
ALIAS = "tiny-gemma-4"  # the tiny builds' alias in the catalog: what an agent names


@pytest.fixture(scope="module")
def gateway(local_rig, tmp_path_factory: pytest.TempPathFactory):
    """The gateway in front of rig-local; removed at the end of the file."""
    keys = tmp_path_factory.mktemp("agents-gateway") / "keys.json"
    keys.touch(mode=0o600)
    keys.write_text(json.dumps({"gateway_api_keys": {"agents": KEY}}))
    up = run_playbook("gateway.yml", *INVENTORY, "-e", f"@{keys}")
    assert up.rc == 0, up.output[-6000:]
    yield up
    down = run_playbook("teardown.yml", "-l", "gateway-local", *INVENTORY)
    assert down.rc == 0, down.output[-4000:]
    assert "gemma-gateway" not in rig_containers()


def test_an_agent_through_the_gateway(gateway, figure) -> None:
    figure("gateway.yml in front of rig-local", f"{gateway.seconds:.0f} s")
    http = httpx.Client(verify=ssl.create_default_context(cafile=str(CERT)), timeout=120)
    client = openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, max_retries=0, http_client=http)
    assert_calls_the_tool(client, ALIAS, tiny_facts.TOOL_ASKS[:1])
    assert_streamed_call_is_the_same(client, ALIAS)
    assert_json_schema_answer(client, ALIAS)
