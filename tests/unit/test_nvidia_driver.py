"""roles/nvidia_driver: syntax, argument validation, and honest skipping where there is no GPU.

The role cannot be converged for real without a T4 VM; these tests prove what can be proven here.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN


def has_nvidia_device() -> bool:
    """True when this machine has an NVIDIA PCI device (vendor 0x10de)."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() == "0x10de":
                return True
        except OSError:
            continue
    return False


def play(tmp_path: Path, extra_vars: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(
        yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "roles": ["nvidia_driver"]}])
    )
    evars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(VENV_BIN / "python"),
        **extra_vars,
    }
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
    }
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", json.dumps(evars), *args, str(book)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=300)


def test_syntax_check(tmp_path: Path) -> None:
    res = play(tmp_path, {}, "--syntax-check")
    assert res.returncode == 0, res.stdout + res.stderr


def test_configure_playbook_syntax() -> None:
    """The playbook that uses the role on gce rigs parses with it."""
    res = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "--syntax-check", "playbooks/configure.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("nvidia_driver_reboot", "sometimes"),
        ("nvidia_driver_min_version", "recent"),
        ("nvidia_driver_packages", {"not": "a list"}),
    ],
)
def test_bad_variable_fails_before_any_task_naming_it(tmp_path: Path, var: str, value: Any) -> None:
    res = play(tmp_path, {var: value})
    assert res.returncode != 0
    out = json.loads(res.stdout)
    tasks = out["plays"][0]["tasks"]
    # The only task that ran is the argument validation, and it names the variable.
    assert [t["hosts"]["localhost"]["action"] for t in tasks] == ["ansible.builtin.validate_argument_spec"]
    assert var in json.dumps(tasks[0]["hosts"]["localhost"])


@pytest.mark.skipif(
    has_nvidia_device(), reason="this machine has an NVIDIA GPU: the role would install a driver"
)
def test_without_gpu_everything_is_skipped_with_the_reason(tmp_path: Path) -> None:
    res = play(tmp_path, {})
    assert res.returncode == 0, res.stdout + res.stderr
    results = {
        t["task"]["name"].split(" : ")[-1]: t["hosts"]["localhost"]
        for t in json.loads(res.stdout)["plays"][0]["tasks"]
    }
    reason = results["Explain why the driver tasks are skipped"]
    assert "SKIPPED (no GPU)" in reason["msg"] and "Tesla T4" in reason["msg"]
    install = results["Install the driver and check the GPU"]
    assert install.get("skipped") is True
    assert not any(r.get("changed") for r in results.values())
