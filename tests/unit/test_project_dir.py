"""The project root (rig_project_dir) and the controller's build directory are defined once:
inventory/group_vars/all/project.yml. bench.yml and accuracy.yml, which may run with an inventory
that lacks the project's group_vars (a vLLM started by hand), read that same file through the link
playbooks/vars/project.yml instead of restating it as a fallback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

DEFINITION = ROOT / "inventory" / "group_vars" / "all" / "project.yml"


def yaml_sources() -> list[Path]:
    found = [
        *ROOT.glob("*.yml"),
        *(p for d in ("roles", "playbooks", "inventory") for p in ROOT.glob(f"{d}/**/*.yml")),
    ]
    return sorted({p.resolve() for p in found if p.is_file()})


def test_one_definition() -> None:
    assert yaml.safe_load(DEFINITION.read_text()) == {
        "rig_project_dir": "{{ ansible_config_file | dirname }}",
        "rig_controller_build_dir": "{{ rig_project_dir }}/build",
    }
    files = yaml_sources()
    assert len(files) > 40, "the scan found too few files: it is broken"
    defining = [str(p.relative_to(ROOT)) for p in files if "ansible_config_file" in p.read_text()]
    assert defining == ["inventory/group_vars/all/project.yml"]
    fallbacks = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in files
        for line in p.read_text().splitlines()
        if "rig_project_dir | default(" in line or "rig_controller_build_dir | default(" in line
    ]
    assert not fallbacks, "\n".join(fallbacks)


def test_the_playbooks_read_the_group_vars_file_itself() -> None:
    link = ROOT / "playbooks" / "vars" / "project.yml"
    assert link.is_symlink() and link.resolve() == DEFINITION.resolve()
    for name in ("bench.yml", "accuracy.yml"):
        find, play = yaml.safe_load((ROOT / "playbooks" / name).read_text())
        assert find["ansible.builtin.import_playbook"] == "find_vms.yml", name  # gce VMs' addresses first
        first = (play.get("pre_tasks") or play["tasks"])[0]
        assert first["ansible.builtin.include_vars"]["file"] == "project.yml", name
        # Only when the inventory lacks it: an inventory's own values keep their precedence.
        assert first["when"] == "rig_project_dir is not defined", name


@pytest.mark.parametrize("playbook", ["bench.yml", "accuracy.yml"])
def test_bench_and_accuracy_find_the_project_without_group_vars(tmp_path: Path, playbook: str) -> None:
    """Check mode, an inventory with no group_vars: the playbook reads the project's paths (accuracy
    finds its data set under the project with them), and a later play sees what it read."""
    host = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    (tmp_path / "inventory.yml").write_text(json.dumps({"rigs": {"hosts": {"r": host}}}))
    said = tmp_path / "said.json"
    plays = [
        {"ansible.builtin.import_playbook": str(ROOT / "playbooks" / playbook)},
        {
            "hosts": "rigs",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.copy": {
                        "content": "{{ [rig_project_dir, rig_controller_build_dir] | to_json }}",
                        "dest": str(said),
                        "mode": "0644",
                    },
                    "check_mode": False,
                }
            ],
        },
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"), "--check",
         str(tmp_path / "play.yml")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    read = out.split("TASK [Read the project's paths", 1)[1].split("TASK", 1)[0]
    assert "ok: [r]" in read, out[-4000:]
    if playbook == "accuracy.yml":
        assert (
            "ok: [r -> localhost]" in out.split("TASK [accuracy : Find the data set on the controller]", 1)[1]
        )
        assert "TASK [accuracy : End here in check mode" in out
    else:
        assert "bench.yml would run 8 cells" in out
    assert json.loads(said.read_text()) == [str(ROOT), str(ROOT / "build")]
