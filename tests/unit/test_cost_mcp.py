"""The MCP cost tool, called through the official SDK's stdio client, returns the figures
playbooks/cost.yml made, which are the module's own for the same VM at the same "now"."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import anyio
import yaml

from tests.fake_compute.harness import run_module
from tests.fake_compute.server import FakeComputeServer
from tests.fake_compute.state import Faults
from tests.unit.mcp_stack import call_tools, isolated_env, stdio
from tests.unit.test_cost import NOW, PRICES, VM


def test_the_cost_tool_gives_the_modules_figures(tmp_path: Path) -> None:
    with FakeComputeServer(Faults()) as fake:
        fake.api.clock = lambda: datetime.fromisoformat("2026-12-02T12:00:00-08:00")
        assert not run_module(fake.endpoint, state="started", **VM).get("failed")
        direct = run_module(
            fake.endpoint,
            module="rig_cost",
            platform="gce",
            data_disk="rig1-data",
            prices=PRICES,
            now=NOW,
            **VM,
        )["report"]
        host = {
            "ansible_connection": "local",
            "gce_project": "proj", "gce_zones": VM["zones"], "gce_auth_kind": "anonymous",
            "gce_api_endpoint": fake.endpoint, "gce_cost_now": NOW, "rig_prices": PRICES,
        }  # fmt: skip
        inventory = tmp_path / "cloud.yml"
        inventory.write_text(yaml.safe_dump({"rigs": {"children": {"gce": {"hosts": {"rig1": host}}}}}))
        (result,) = anyio.run(
            call_tools, stdio(["-i", str(inventory)], isolated_env(tmp_path)), [("cost", {})]
        )
    assert not result.is_error, result.content[0].text
    doc = json.loads(result.content[0].text)
    (rig,) = doc["rigs"]
    assert rig == direct
    assert doc["fleet"]["month_to_date_usd"] == direct["month_to_date_usd"] > 0
    assert doc["fleet"]["projected_month_usd"] == direct["projected_month_usd"]
    assert doc["fleet"]["all_measured"] is True
