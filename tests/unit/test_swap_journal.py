"""roles/vllm_service/files/swap_journal.py: the swap journal and the unit's start guard.

Run as a program, as the rig runs it, on a stand-in rig in a temporary directory: tpu.env, the
`current` link, two checkpoint directories, and a stand-in systemctl that records its calls.
tests/e2e/test_90_swap_crash.py runs the same tool under real systemd with a controller killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

TOOL = ROOT / "roles" / "vllm_service" / "files" / "swap_journal.py"
OLD_ENV = b"RIG_MODEL_KEY=old\nRIG_SERVED_MODEL_NAME=old\n"
NEW_ENV = b"RIG_MODEL_KEY=new\nRIG_SERVED_MODEL_NAME=new\n"


@dataclass
class Rig:
    root: Path

    @property
    def env(self) -> Path:
        return self.root / "etc" / "tpu.env"

    @property
    def current(self) -> Path:
        return self.root / "models" / "current"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def calls(self) -> list[str]:
        log = self.root / "systemctl.log"
        return log.read_text().splitlines() if log.exists() else []

    def run(self, *args: str, invocation: str = "inv-1") -> subprocess.CompletedProcess[str]:
        cmd = [
            sys.executable,
            str(TOOL),
            "--state-dir",
            str(self.state),
            "--env-file",
            str(self.env),
            "--current",
            str(self.current),
            "--unit",
            "vllm",
            "--systemctl",
            str(self.root / "systemctl"),
            *args,
        ]
        env = {**os.environ, "INVOCATION_ID": invocation}
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)

    def journal(self) -> dict:
        return json.loads((self.state / "swap.json").read_text())

    def serves(self) -> tuple[str, bytes]:
        return os.readlink(self.current), self.env.read_bytes()


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "tpu.env").write_bytes(OLD_ENV)
    for name in ["old-aaaaaaaaaaaa", "new-bbbbbbbbbbbb"]:
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    os.symlink(str(tmp_path / "models" / "old-aaaaaaaaaaaa"), tmp_path / "models" / "current")
    fake = tmp_path / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/systemctl.log\n')
    fake.chmod(0o755)
    (tmp_path / "tpu.env.to").write_bytes(NEW_ENV)
    return Rig(tmp_path)


OLD = "old-aaaaaaaaaaaa"
NEW = "new-bbbbbbbbbbbb"


def switched(rig: Rig) -> None:
    assert rig.run("begin", "--from", "old", "--to", "new").returncode == 0
    res = rig.run(
        "switch", "--to-target", str(rig.root / "models" / NEW), "--env-next", str(rig.root / "tpu.env.to")
    )
    assert res.returncode == 0, res.stderr


def test_begin_journals_and_keeps_the_old_env_before_anything_changes(rig: Rig) -> None:
    res = rig.run("begin", "--from", "old", "--to", "new")
    assert res.returncode == 0, res.stderr
    journal = rig.journal()
    assert (journal["from"], journal["to"], journal["phase"]) == ("old", "new", "staging")
    assert journal["from_target"].endswith(OLD)
    assert (rig.state / "tpu.env.from").read_bytes() == OLD_ENV
    assert rig.serves() == (str(rig.root / "models" / OLD), OLD_ENV)
    # A start while staging (vLLM crashed, a reboot) runs the old model as it is.
    assert rig.run("guard").returncode == 0
    assert rig.serves()[1] == OLD_ENV
    again = rig.run("begin", "--from", "old", "--to", "other")
    assert again.returncode == 2
    assert "interrupted swap old -> new (phase staging)" in again.stderr


def test_switch_restarts_once_and_the_trial_start_is_the_only_one_allowed(rig: Rig) -> None:
    switched(rig)
    assert rig.calls == ["reset-failed vllm", "restart vllm"]
    assert rig.serves() == (str(rig.root / "models" / NEW), NEW_ENV)
    assert rig.journal()["phase"] == "switching"

    trial = rig.run("guard", invocation="inv-trial")
    assert trial.returncode == 0, trial.stderr
    assert (rig.journal()["phase"], rig.journal()["trial_invocation"]) == ("trial", "inv-trial")

    # The new model crashed (or someone restarted it) before the swap committed.
    crash = rig.run("guard", invocation="inv-2")
    assert crash.returncode == 1
    assert "swap old -> new was never committed" in crash.stderr
    assert rig.serves() == (str(rig.root / "models" / OLD), OLD_ENV)
    assert rig.journal()["phase"] == "reverted"
    # systemd's restart after that failed start now reads the old tpu.env and may start.
    assert rig.run("guard", invocation="inv-3").returncode == 0
    assert rig.serves()[1] == OLD_ENV


def test_a_reboot_before_the_trial_start_reverts(rig: Rig) -> None:
    switched(rig)
    journal = rig.journal()
    journal["trial_boot_id"] = "another-boot"
    (rig.state / "swap.json").write_text(json.dumps(journal))
    res = rig.run("guard")
    assert res.returncode == 1
    assert "switched in another boot" in res.stderr
    assert rig.serves() == (str(rig.root / "models" / OLD), OLD_ENV)


def test_commit_makes_every_later_start_serve_the_new_model(rig: Rig) -> None:
    switched(rig)
    assert rig.run("commit").returncode == 2  # no trial start yet: nothing answered
    assert rig.run("guard").returncode == 0
    assert rig.run("commit").returncode == 0
    assert rig.journal()["phase"] == "committed"
    assert rig.run("guard").returncode == 0
    assert rig.serves() == (str(rig.root / "models" / NEW), NEW_ENV)
    assert rig.run("begin", "--from", "new", "--to", "old").returncode == 0  # the next swap may begin


def test_rollback_says_whether_vllm_must_restart(rig: Rig) -> None:
    assert rig.run("begin", "--from", "old", "--to", "new").returncode == 0
    before = rig.run("rollback", "--reason", "push failed")
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["restart_needed"] is False  # the old model never stopped
    assert rig.journal()["phase"] == "rolled-back"

    switched(rig)
    assert rig.run("guard").returncode == 0
    after = json.loads(rig.run("rollback", "--reason", "no answer").stdout)
    assert after["restart_needed"] is True and after["files_restored"] is True
    assert rig.serves() == (str(rig.root / "models" / OLD), OLD_ENV)


def test_a_swap_the_guard_reverted_rolls_back_without_a_restart(rig: Rig) -> None:
    switched(rig)
    rig.run("guard")
    rig.run("guard")  # the crash: reverted
    out = json.loads(rig.run("rollback").stdout)
    assert out["restart_needed"] is False and out["rolled_back_from"] == "reverted"


def test_an_unreadable_journal_never_keeps_vllm_down(rig: Rig) -> None:
    rig.state.mkdir()
    (rig.state / "swap.json").write_text("{not json")
    res = rig.run("guard")
    assert res.returncode == 0
    assert "unreadable" in res.stderr
    shown = rig.run("show")
    assert shown.returncode == 2 and "swap.json is unreadable" in shown.stderr


def test_switch_refuses_a_target_without_a_checkpoint(rig: Rig) -> None:
    rig.run("begin", "--from", "old", "--to", "new")
    res = rig.run(
        "switch", "--to-target", str(rig.root / "models"), "--env-next", str(rig.root / "tpu.env.to")
    )
    assert res.returncode == 2 and "holds no checkpoint" in res.stderr
    assert rig.serves()[1] == OLD_ENV and rig.calls == []
