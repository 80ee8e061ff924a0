"""The turing_clamp Ansible module run by real ansible-playbook, and the standalone clamp-check."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, VENV_BIN
from tests.unit.test_turing_clamp import copy_of_vllm_file, tc

# The ExecStartPre check: the module's own module_utils file, which its checker option installs.
CHECK = ROOT / "module_utils" / "turing_clamp.py"


def playbook(tmp_path: Path, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``tasks`` on localhost with the json callback; return each task's result in order."""
    book = tmp_path / "play.yml"
    book.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",  # not profile_tasks: stdout must be JSON
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
    }
    res = subprocess.run(
        [
            str(VENV_BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={VENV_BIN / 'python'}",
            str(book),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    out = json.loads(res.stdout)
    return [task["hosts"]["localhost"] for task in out["plays"][0]["tasks"]]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_idempotence_and_check_mode(tmp_path: Path) -> None:
    target = copy_of_vllm_file(tmp_path)
    original = sha256(target)

    def step(state: str, **extra: Any) -> dict[str, Any]:
        return {"turing_clamp": {"path": str(target), "state": state}, "ignore_errors": True, **extra}

    def digest() -> dict[str, Any]:
        return {"ansible.builtin.stat": {"path": str(target), "checksum_algorithm": "sha256"}}

    results = playbook(
        tmp_path,
        [
            step("present", check_mode=True, diff=True),  # 0: would change
            digest(),  # 1: ... but did not
            step("present"),  # 2: changed
            digest(),  # 3
            step("present"),  # 4: not changed
            step("absent", check_mode=True),  # 5: would change
            digest(),  # 6: ... but did not
            step("absent"),  # 7: changed
            digest(),  # 8: original bytes
            step("absent"),  # 9: not changed
        ],
    )
    assert not any(r.get("failed") for r in results), results
    assert results[0]["changed"] and results[0]["occurrences"] == 1
    assert "gemma-rig turing clamp" in results[0]["diff"]["after"]
    assert results[1]["stat"]["checksum"] == original
    assert results[2]["changed"] and results[2]["occurrences"] == 1
    assert results[3]["stat"]["checksum"] != original
    assert not results[4]["changed"] and results[4]["occurrences"] == 1
    assert results[5]["changed"] and results[5]["occurrences"] == 0
    assert results[6]["stat"]["checksum"] == results[3]["stat"]["checksum"]
    assert results[7]["changed"] and results[7]["occurrences"] == 0
    assert results[8]["stat"]["checksum"] == original
    assert not results[9]["changed"]


def test_other_vllm_version_fails_and_changes_nothing(tmp_path: Path) -> None:
    target = copy_of_vllm_file(tmp_path)
    target.write_text(target.read_text().replace("def _get_tile_size(", "def _pick_tile_size(", 1))
    before = sha256(target)
    results = playbook(tmp_path, [{"turing_clamp": {"path": str(target)}, "ignore_errors": True}])
    assert results[0]["failed"]
    assert "anchor 'tile size helper' is missing" in results[0]["msg"]
    assert sha256(target) == before


def test_bad_input_is_named(tmp_path: Path) -> None:
    results = playbook(
        tmp_path,
        [
            {"turing_clamp": {"state": "present"}, "ignore_errors": True},
            {"turing_clamp": {"path": str(tmp_path / "nope.py")}, "ignore_errors": True},
            {"turing_clamp": {"path": "/x", "python": "/y"}, "ignore_errors": True},
            {"turing_clamp": {"path": "/x", "smem_budget": 0}, "ignore_errors": True},
        ],
    )
    assert all(r["failed"] for r in results)
    assert "path, python" in results[0]["msg"]
    assert "does not exist" in results[1]["msg"]
    assert "mutually exclusive" in results[2]["msg"]
    assert "smem_budget" in results[3]["msg"]


def fake_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A virtualenv whose site-packages holds only vllm's attention file (a real copy)."""
    venv = tmp_path / "venv"
    subprocess.run([str(VENV_BIN / "python"), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    target = site / "vllm" / tc.RELATIVE_PATH
    target.parent.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise ImportError('locating must not import vllm')\n")
    target.write_bytes(copy_of_vllm_file(tmp_path).read_bytes())
    return venv / "bin" / "python", target


def test_python_parameter_locates_without_importing(tmp_path: Path) -> None:
    python, target = fake_venv(tmp_path)
    results = playbook(tmp_path, [{"turing_clamp": {"python": str(python)}}])
    assert results[0]["changed"]
    assert Path(results[0]["path"]) == target
    assert tc.count(target.read_text()) == 1


def clamp_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "python"), str(CHECK), *args], capture_output=True, text=True, check=False
    )


def test_clamp_check_cli(tmp_path: Path) -> None:
    python, target = fake_venv(tmp_path)
    missing = clamp_check("check", "--python", str(python))
    assert missing.returncode == 1 and "missing" in missing.stderr

    target.write_text(tc.apply(target.read_text()))
    present = clamp_check("check", "--python", str(python))
    assert present.returncode == 0, present.stderr
    assert str(target) in present.stdout

    block = tc.clamp_block()
    target.write_text(target.read_text().replace(block, block + block))
    twice = clamp_check("check", "--path", str(target))
    assert twice.returncode == 1 and "2 times" in twice.stderr

    nofile = clamp_check("check", "--path", str(tmp_path / "nope.py"))
    assert nofile.returncode == 1 and "nope.py" in nofile.stderr


def test_clamp_check_runs_with_the_interpreter_it_checks(tmp_path: Path) -> None:
    """As the role installs it (the module's checker, alone in its folder) and ExecStartPre runs
    it: ``<venv>/bin/python -I clamp-check check``, no --python."""
    python, target = fake_venv(tmp_path)
    target.write_text(tc.apply(target.read_text()))
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    installed = libexec / "clamp-check"
    results = playbook(tmp_path, [{"turing_clamp": {"checker": str(installed)}}])
    assert results[0]["changed"] and os.listdir(libexec) == ["clamp-check"], results
    res = subprocess.run([str(python), "-I", str(installed), "check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("clamp-check: turing clamp present once in ")


@pytest.mark.parametrize("args", [["--help"], ["check", "--help"]])
def test_clamp_check_help(args: list[str]) -> None:
    res = clamp_check(*args)
    assert res.returncode == 0 and "clamp" in res.stdout
