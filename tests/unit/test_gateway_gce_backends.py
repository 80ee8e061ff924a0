"""Which address the gateway reaches a Compute Engine rig at (roles/gateway, tasks/served.yml).

A gce rig provisioned in the run has gce_internal_ip (roles/gce's add_host); with its endpoint open
to the VPC (gce_internal_endpoint makes rig_endpoint_open true) the gateway's server line points
there. A gce rig without an internal address, or whose vLLM listens on loopback only, is refused
before any rig is contacted. The role's `tls` and `config` tasks run on the controller, rendering
files only (gateway_service_manage: false), as tests/unit/test_gateway_config.py runs them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import PlaybookRun, render_gateway
from tests.conftest import ROOT, VENV_BIN

KEY = "sk-gw-unit-0123456789abcdef"  # a test-only key


def _render(tmp: Path, rig_vars: dict) -> tuple[PlaybookRun, Path]:
    inventory = tmp / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    env = tmp / "rig.env"
    env.write_text("RIG_MODEL_KEY=emb4\nRIG_SERVED_MODEL_NAME=emb4\n")
    etc = tmp / "etc"
    hosts = {
        "rigs": {"children": {"gce": {"hosts": {"rig-1": {**local, "rig_env_file": str(env), **rig_vars}}}}},
        "gateways": {
            "hosts": {
                "gw": {
                    **local,
                    "gateway_service_manage": False,
                    "gateway_config_dir": str(etc),
                    "gateway_admin_socket": str(tmp / "admin.sock"),
                    "gateway_controller_dir": str(tmp / "ctl"),
                    "gateway_address": "127.0.0.1",
                }
            }
        },
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return render_gateway(tmp, inventory, {"gateway_api_keys": {"alice": KEY}}), etc / "haproxy.cfg"


def test_a_gce_rig_open_to_the_vpc_is_reached_at_its_internal_address(tmp_path: Path) -> None:
    assert shutil.which("haproxy"), "haproxy is not installed on the controller: run scripts/setup.sh"
    run, cfg = _render(tmp_path, {"gce_internal_ip": "10.128.0.7", "rig_endpoint_open": True})
    assert run.rc == 0, run.output[-6000:]
    assert "server rig-1 10.128.0.7:8000 check" in cfg.read_text()


@pytest.mark.parametrize(
    "rig_vars",
    [
        {"gce_internal_ip": "10.128.0.7", "rig_endpoint_open": False},  # vLLM on loopback only
        {"rig_endpoint_open": True},  # not provisioned in this run: no internal address known
    ],
)
def test_a_gce_rig_the_gateway_cannot_reach_is_refused(tmp_path: Path, rig_vars: dict) -> None:
    run, cfg = _render(tmp_path, rig_vars)
    out = " ".join(run.output.split())
    assert run.rc == 2 and "The gateway cannot reach rig-1" in out, out[-3000:]
    assert "TASK [gateway : Read each rig's tpu.env]" not in out  # refused before any rig is asked
    assert not cfg.exists()


def test_gateway_backend_address_still_wins(tmp_path: Path) -> None:
    run, cfg = _render(tmp_path, {"gateway_backend_address": "10.0.0.9"})
    assert run.rc == 0, run.output[-6000:]
    assert "server rig-1 10.0.0.9:8000 check" in cfg.read_text()
