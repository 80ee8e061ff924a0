"""The MCP metrics tool: through the SDK's stdio client, status.yml runs gateway-ctl metrics on each
gateway against the real Prometheus (backfilled), and the tool hands on each gateway's view (or
that it has no monitoring). Its argument is checked by the schema and again in code, and its
result is redacted like the status tool's."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import pytest
import yaml
from mcp.server.mcpserver.exceptions import ToolError

from rig_mcp.playbooks import PlayRun
from rig_mcp.redact import MASK
from rig_mcp.server import METRICS_TASK, Config, RigServer
from tests import prometheus_backfill as pb
from tests.unit.mcp_stack import call_tools, isolated_env, stdio
from tests.unit.test_rig_mcp import HOSTILE, FakeRunner, call


def installed_ctl(directory: Path) -> Path:
    """gateway-ctl as the gateway role installs it (executable), run by this Python."""
    source = (pb.ROOT / "roles/gateway/files/gateway-ctl").read_text()
    ctl = directory / "gateway-ctl"
    ctl.write_text(f"#!{sys.executable} -I\n" + source.split("\n", 1)[1])
    ctl.chmod(0o755)
    return ctl


def test_the_tool_gives_each_gateways_view_from_prometheus(tmp_path: Path) -> None:
    pb.require_binaries()
    pb.backfill(tmp_path / "tsdb", pb.fleet_openmetrics(time.time()), tmp_path)
    ctl = installed_ctl(tmp_path)
    with pb.prometheus(tmp_path / "tsdb", tmp_path) as url:
        gateway = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                   "gateway_ctl": str(ctl)}  # fmt: skip
        hosts = {
            "gw": {**gateway, "monitoring_prometheus_port": int(url.rsplit(":", 1)[1])},
            "gw-bare": {**gateway, "monitoring_prometheus_port": pb.free_port()},  # no Prometheus
        }
        inventory = tmp_path / "fleet.yml"
        inventory.write_text(yaml.safe_dump({"gateways": {"hosts": hosts}}))
        (result,) = anyio.run(
            call_tools, stdio(["-i", str(inventory)], isolated_env(tmp_path)), [("metrics", {"minutes": 5})]
        )
    assert not result.is_error, result.content[0].text
    doc = json.loads(result.content[0].text)
    assert doc["minutes"] == 5
    views = {view["host"]: view for view in doc["views"]}
    assert set(views) == {"gw", "gw-bare"}
    assert views["gw-bare"]["monitoring"] is False and "did not answer" in views["gw-bare"]["note"]
    seen = views["gw"]
    assert seen["monitoring"] is True and seen["minutes"] == 5
    assert sorted(seen["rigs"]) == ["rig-a", "rig-b"]
    assert round(seen["rigs"]["rig-b"]["generation_tokens_per_s"]) == 80


@pytest.mark.parametrize("minutes", [0, -1, 1441, 10**9, "15", "1; rm -rf /", 1.5, True, None])
def test_minutes_outside_1_to_1440_is_refused_before_anything_runs(tmp_path: Path, minutes) -> None:
    runner = FakeRunner()
    got = call(Config(lock_dir=tmp_path), runner, "metrics", {"minutes": minutes})
    assert got.is_error
    (line,) = got.content[0].text.splitlines()
    assert line.startswith("metrics: bad arguments: minutes:"), line
    assert runner.calls == []


@pytest.mark.parametrize("minutes", [0, 1441, True, "15"])
def test_the_code_checks_minutes_again(tmp_path: Path, minutes) -> None:
    runner = FakeRunner()
    with pytest.raises(ToolError, match="minutes must be a whole number from 1 to 1440"):
        anyio.run(RigServer(Config(lock_dir=tmp_path), runner).metrics, minutes)
    assert runner.calls == []


def metrics_run(*results: tuple[str, dict]) -> PlayRun:
    """A status.yml run whose metrics task registered ``results`` (host, res) on the gateways."""
    rows = [{"task": METRICS_TASK, "host": host, "res": res, "failed": False} for host, res in results]
    return PlayRun("playbooks/status.yml", "successful", 0, results=rows)


def test_the_view_is_redacted_and_handed_on(tmp_path: Path) -> None:
    view = {"prometheus": "http://127.0.0.1:9090", "minutes": 15, "rigs": {"r": {"aborted": 0}},
            "gateway": {}, "notes": [HOSTILE], "lines": [HOSTILE]}  # fmt: skip
    runner = FakeRunner({"playbooks/status.yml": metrics_run(
        ("gw", {"rc": 0, "stdout": json.dumps(view)}),
        ("localhost", {"skipped": True}),
    )})  # fmt: skip
    got = call(Config(lock_dir=tmp_path), runner, "metrics", {})
    assert not got.is_error, got.content[0].text
    (seen,) = got.structured_content["views"]
    shown = HOSTILE.replace("s3cr3t-token", MASK)
    assert seen == {
        "host": "gw",
        "monitoring": True,
        **view,
        "notes": [shown],
        "lines": [shown],
    }
    assert runner.calls == [
        ("playbooks/status.yml", "gateways,localhost", {"metrics_minutes": 15, "status_metrics_only": True})
    ]


@pytest.mark.parametrize("stdout", ["", "not json", "[1]", json.dumps({"rigs": "x"})])
def test_a_view_that_is_not_gateway_ctls_is_a_tool_error(tmp_path: Path, stdout: str) -> None:
    runner = FakeRunner({"playbooks/status.yml": metrics_run(("gw", {"rc": 0, "stdout": stdout}))})
    got = call(Config(lock_dir=tmp_path), runner, "metrics", {"minutes": 1})
    assert got.is_error and got.content[0].text == "gateway-ctl metrics on gw printed no metrics view"


def test_no_metrics_task_anywhere_is_a_tool_error(tmp_path: Path) -> None:
    runner = FakeRunner({"playbooks/status.yml": metrics_run()})
    got = call(Config(lock_dir=tmp_path), runner, "metrics", {})
    assert got.is_error and "ran gateway-ctl metrics nowhere" in got.content[0].text


def test_a_fleet_with_no_gateway_gets_the_controllers_view(tmp_path: Path) -> None:
    """No gateway: monitoring is on the controller, and status.yml runs the repository's
    gateway-ctl there."""
    pb.require_binaries()
    pb.backfill(tmp_path / "tsdb", pb.fleet_openmetrics(time.time()), tmp_path)
    with pb.prometheus(tmp_path / "tsdb", tmp_path) as url:
        inventory = tmp_path / "fleet.yml"
        port = int(url.rsplit(":", 1)[1])
        inventory.write_text(yaml.safe_dump({"all": {"vars": {"monitoring_prometheus_port": port}}}))
        (result,) = anyio.run(
            call_tools, stdio(["-i", str(inventory)], isolated_env(tmp_path)), [("metrics", {})]
        )
    assert not result.is_error, result.content[0].text
    (view,) = json.loads(result.content[0].text)["views"]
    assert view["host"] == "localhost" and view["minutes"] == 15
    assert sorted(view["rigs"]) == ["rig-a", "rig-b"]
