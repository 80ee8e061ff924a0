"""The checks a rig runs before every start have one source: the patch modules' module_utils files.

Each patch module writes its own module_utils file, read through its loader (AnsiballZ's zip when
run by Ansible), to the path its ``checker`` option names; the vllm_service role calls it there
and the unit runs what it wrote. No other copy exists to drift.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import module_docs
from tests.conftest import ROOT
from tests.unit.test_turing_clamp_module import playbook

SOURCES = {
    "turing_clamp": ROOT / "module_utils" / "turing_clamp.py",
    "tpu_inference_patch": ROOT / "module_utils" / "tpu_inference_patch.py",
}


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_the_installed_checker_is_the_source(module: str, tmp_path: Path) -> None:
    """Check mode writes nothing, the write is the source byte for byte with the mode asked for,
    a second run changes nothing, and a checker edited on the rig is put back."""
    dest = tmp_path / "libexec" / "checker"
    dest.parent.mkdir()

    def step(**extra: object) -> dict:
        return {module: {"checker": str(dest), "mode": "0644"}, **extra}

    first = playbook(tmp_path, [step(check_mode=True, diff=True)])
    assert first[0]["changed"] and not dest.exists(), first
    assert first[0]["diff"]["after"] == SOURCES[module].read_text()

    results = playbook(tmp_path, [step(), step()])
    assert [r["changed"] for r in results] == [True, False], results
    assert dest.read_bytes() == SOURCES[module].read_bytes()
    assert dest.stat().st_mode & 0o777 == 0o644

    dest.write_text("edited on the rig\n")
    os.chmod(dest, 0o600)
    again = playbook(tmp_path, [step()])
    assert again[0]["changed"] and dest.read_bytes() == SOURCES[module].read_bytes()
    assert dest.stat().st_mode & 0o777 == 0o644


def test_no_other_copy_of_a_source_is_tracked() -> None:
    """The project holds each checker's code once (a copy would be what the rig runs, unchecked)."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    wanted = {path.read_bytes() for path in SOURCES.values()}
    files = [ROOT / name for name in listed.stdout.splitlines()]
    copies = [f for f in files if f.is_file() and f not in SOURCES.values() and f.read_bytes() in wanted]
    assert copies == [], f"copies of a checker's source: {copies}"


def test_the_unit_runs_what_the_role_installs() -> None:
    """Each checker task's path is the one an ExecStartPre of the unit runs, under its own switch."""
    role = ROOT / "roles" / "vllm_service"
    tasks = yaml.safe_load((role / "tasks" / "main.yml").read_text())
    unit = (role / "templates" / "vllm.service.j2").read_text()
    installs = {t["name"]: t for t in tasks if any(m in t for m in SOURCES)}
    assert len(installs) == len(SOURCES), list(installs)
    for task in installs.values():
        (module,) = [m for m in SOURCES if m in task]
        path = task[module]["checker"]
        run = f"ExecStartPre={{{{ _vllm_service_python }}}} -I {path} check --python {{{{ _vllm_service_python }}}}"
        assert run in unit, (module, path)
        switch = task["when"]
        assert (
            unit.index(f"{{% if {switch} %}}") < unit.index(run) < unit.index("{% endif %}", unit.index(run))
        )


def test_ansible_doc_renders_the_checker_option() -> None:
    docs = module_docs(*SOURCES)
    for module in SOURCES:
        assert {"checker", "owner", "group", "mode"} <= set(docs[module]["doc"]["options"]), module
        assert "checker" in docs[module]["return"] and "checker:" in docs[module]["examples"]
