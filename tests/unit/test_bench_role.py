"""roles/bench holds the benchmark; playbooks/bench.yml only finds the project and runs the role."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.conftest import ROOT, VENV_BIN

ROLE = ROOT / "roles" / "bench"
# Validation reads every option's value; these default to group_vars an inventory of a vLLM
# started by hand lacks (roles/bench/meta/argument_specs.yml says so).
UNVALIDATED = {"bench_model_dir", "bench_env_file", "bench_unit"}


def test_the_playbook_is_a_thin_wrapper() -> None:
    find, play = yaml.safe_load((ROOT / "playbooks" / "bench.yml").read_text())
    assert find == {"name": "Find the cloud VMs", "ansible.builtin.import_playbook": "find_vms.yml"}
    assert play["roles"] == [{"role": "bench"}]
    assert "tasks" not in play and "vars" not in play and "post_tasks" not in play
    assert [t["name"] for t in play["pre_tasks"]] == [
        "Read the project's paths when the inventory lacks its group_vars (a vLLM started by hand)"
    ]


def test_every_default_is_in_the_argument_spec() -> None:
    defaults = set(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))
    options = set(
        yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"][
            "options"
        ]
    )
    assert defaults - options == UNVALIDATED
    assert options - defaults == {"bench_run_id"}  # optional: unset names the run by host, model and time


def test_a_bad_grid_fails_before_the_rig_is_touched(tmp_path: Path) -> None:
    host = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    (tmp_path / "inventory.yml").write_text(json.dumps({"rigs": {"hosts": {"r": host}}}))
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
         str(ROOT / "playbooks" / "bench.yml"), "-e", json.dumps({"bench_concurrency": [0, 4]})],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    failed = out.split("TASK [bench : Check the grid]", 1)[1]
    assert "bench_concurrency must be" in failed and "got [512, 4096], [0, 4]" in failed, out[-3000:]
    assert "Gather the rig's facts" not in out and "Ask the rig what it serves" not in out
