"""status.yml asks each gateway's gateway-ctl for its view with the rig-waker file under that
gateway's own configuration directory (its spot recovery state), not gateway-ctl's built-in path.
The gateway here is this controller (local connection) with a gateway-ctl that records its argv."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import run_playbook

RECORDER = """#!{python}
import json, sys
with open({out!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if "metrics" in sys.argv:
    sys.exit(3)  # gateway-ctl's answer when no Prometheus answers: status.yml shows no metrics view
print("gw: rig-a UP")
"""


@pytest.mark.parametrize("config_dir", [None, "/srv/gw conf"])
def test_status_passes_the_gateways_own_waker_config(tmp_path: Path, config_dir: str | None) -> None:
    calls = tmp_path / "calls.jsonl"
    ctl = tmp_path / "gateway-ctl"
    ctl.write_text(RECORDER.format(python=sys.executable, out=str(calls)))
    ctl.chmod(0o755)
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "gateway_ctl": str(ctl), "gateway_admin_socket": str(tmp_path / "admin.sock")}  # fmt: skip
    if config_dir is not None:
        host["gateway_config_dir"] = config_dir
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"gateways": {"hosts": {"gw": host}}}))
    # The repository's inventory brings group_vars/all (gateway_url, ...); --limit keeps its rigs out.
    run = run_playbook(
        "playbooks/status.yml", "-i", "inventory/local.yml", "-i", str(inventory), "--limit", "gw",
        "-e", "metrics_minutes=1",
    )  # fmt: skip
    assert run.rc == 0, run.output[-3000:]
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    (status,) = [a for a in argvs if "status" in a]
    expected = f"{config_dir or '/etc/haproxy'}/gemma-gateway/rig-waker.json"
    assert status[status.index("--waker-config") + 1] == expected
    assert status[-2:] == ["status", "--text"]
