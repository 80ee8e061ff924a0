"""The vLLM unit's IP filter as rendered by roles/vllm_service for each endpoint setting.

systemd inside the local rig's container does not enforce IPAddressAllow/IPAddressDeny (no unified
cgroup hierarchy on these hosts), so the filter is tested here as rendered, by the role's own task
file run through real ansible-playbook with the project's inventory, and on the running rig as
systemd loaded it (tests/e2e/test_95_reach.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

pytestmark = pytest.mark.slow  # each case is one ansible-playbook run (~3 s of CPU)

RANGES = ["203.0.113.0/24", "2001:db8:1::/48"]


def render(tmp_path: Path, platform: str, **extra_vars: Any) -> tuple[int, str, dict[str, list[str]]]:
    """Run vllm_service's tasks/unit.yml for one host of ``platform``; return rc, output, filter lines."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"rigs": {"children": {platform: {"hosts": {"rig-test": {}}}}}}))
    unit = tmp_path / "vllm.service"
    play = tmp_path / "play.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "rig-test",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Render the unit",
                            "ansible.builtin.include_role": {"name": "vllm_service", "tasks_from": "unit"},
                        }
                    ],
                }
            ]
        )
    )
    evars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(VENV_BIN / "python"),
        "_vllm_service_unit_path": str(unit),
        "vllm_service_start": False,  # the role's handler then restarts nothing
        **extra_vars,
    }
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(ROOT / "inventory" / "local.yml")]
    cmd += ["-i", str(inventory), "-e", json.dumps(evars), str(play)]
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, check=False)
    lines: dict[str, list[str]] = {}
    if unit.exists():
        for line in unit.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key in ("IPAddressAllow", "IPAddressDeny"):
                lines.setdefault(key, []).append(value)
    return res.returncode, res.stdout + res.stderr, lines


@pytest.mark.parametrize("platform", ["local", "gce"])
def test_closed_endpoint_admits_loopback_only(tmp_path: Path, platform: str) -> None:
    # Ranges listed but the endpoint closed: the unit still admits loopback only.
    rc, out, lines = render(tmp_path, platform, rig_endpoint_source_ranges=RANGES)
    assert rc == 0, out[-3000:]
    assert lines == {"IPAddressDeny": ["any"], "IPAddressAllow": ["localhost"]}


@pytest.mark.parametrize("platform", ["local", "gce"])
def test_open_endpoint_admits_exactly_the_source_ranges(tmp_path: Path, platform: str) -> None:
    rc, out, lines = render(tmp_path, platform, rig_endpoint_open=True, rig_endpoint_source_ranges=RANGES)
    assert rc == 0, out[-3000:]
    # Loopback stays: the rig's own readiness checks and SSH tunnels arrive there.
    assert lines == {"IPAddressDeny": ["any"], "IPAddressAllow": [" ".join(["localhost", *RANGES])]}


def test_gce_endpoint_follows_gce_open_endpoint(tmp_path: Path) -> None:
    # On gce the user opens the endpoint with gce_open_endpoint; the unit follows it.
    rc, out, lines = render(tmp_path, "gce", gce_open_endpoint=True, rig_endpoint_source_ranges=RANGES[:1])
    assert rc == 0, out[-3000:]
    assert lines["IPAddressAllow"] == ["localhost 203.0.113.0/24"]


def test_open_endpoint_without_ranges_is_refused_before_writing(tmp_path: Path) -> None:
    rc, out, lines = render(tmp_path, "local", rig_endpoint_open=True)
    assert rc != 0
    assert "rig_endpoint_open is true but rig_endpoint_source_ranges is empty" in out
    assert lines == {}
