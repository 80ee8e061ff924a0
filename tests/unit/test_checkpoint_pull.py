"""roles/checkpoint's hub pull, run by real ansible-playbook on this machine.

No hub is reachable here, so the rig's interpreter is a virtualenv whose ``huggingface_hub`` is a
stand-in: its ``snapshot_download`` writes a fixed snapshot into ``local_dir`` and records the
endpoint and token it was given. Everything after the download (manifest, hard-linked version
directory, verification, `current`, idempotence, token redaction) is the role's real code.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import VENV_BIN
from tests.unit.checkpoint_play import run_play, write_play

pytestmark = pytest.mark.slow  # several ansible-playbook runs

TOKEN = "hf_secret_token_for_tests_0123"

STAND_IN_COMMIT = "c0ffee" + "0" * 34

STAND_IN = """
import json, os
from pathlib import Path
from types import SimpleNamespace

class HfApi:
    def model_info(self, repo_id, revision=None, **kwargs):
        if os.environ.get("HF_TOKEN") == "bad":
            raise RuntimeError("401 Unauthorized for token " + os.environ["HF_TOKEN"] + " at " + repo_id)
        return SimpleNamespace(sha="c0ffee" + "0" * 34)

def snapshot_download(repo_id, revision="main", local_dir=None, **kwargs):
    root = Path(local_dir)
    seen = {"repo": repo_id, "revision": revision, "endpoint": os.environ.get("HF_ENDPOINT"),
            "token": os.environ.get("HF_TOKEN")}
    Path(os.environ["STAND_IN_LOG"]).write_text(json.dumps(seen))
    if os.environ.get("HF_TOKEN") == "bad":
        raise RuntimeError("401 Unauthorized for token " + os.environ["HF_TOKEN"] + " at " + repo_id)
    files = {"config.json": '{"model": "' + repo_id + '"}', "model.safetensors": "w" * 100000,
             "sub/tokenizer.json": "{}"}
    (root / ".cache").mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:  # like the hub client: skip complete files
            target.write_text(text)
    return str(root)
"""


@pytest.fixture
def rig(tmp_path: Path) -> dict[str, Path]:
    venv = tmp_path / "venv"
    subprocess.run([str(VENV_BIN / "python"), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "huggingface_hub").mkdir()
    (site / "huggingface_hub" / "__init__.py").write_text(STAND_IN)
    handler = {
        "name": "Record the restart",
        "ansible.builtin.file": {"path": str(tmp_path / "restarted"), "state": "touch"},
    }
    play = write_play(tmp_path / "play.yml", handler)
    return {"tmp": tmp_path, "python": venv / "bin" / "python", "play": play, "models": tmp_path / "models"}


def converge(rig: dict[str, Path], token: str = TOKEN) -> tuple[int, list[dict[str, Any]], str]:
    evars = {
        "rig_model": "google-w4a16",
        "checkpoint_models_dir": str(rig["models"]),
        "checkpoint_current_link": str(rig["models"] / "current"),
        "checkpoint_group": "root",
        "checkpoint_hub_python": str(rig["python"]),
        "checkpoint_hub_endpoint": "http://hub-mirror.internal:8080",
        "checkpoint_hub_token": token,
    }
    (rig["tmp"] / "restarted").unlink(missing_ok=True)
    return run_play(rig["play"], evars, env={"STAND_IN_LOG": str(rig["tmp"] / "seen.json")})


def test_pull_lands_verified_behind_current_and_is_idempotent(rig: dict[str, Path]) -> None:
    rc, _, out = converge(rig)
    assert rc == 0, out[-5000:]
    seen = json.loads((rig["tmp"] / "seen.json").read_text())
    assert seen == {
        "repo": "google/gemma-4-E2B-it-qat-w4a16-ct",
        "revision": STAND_IN_COMMIT,  # main, resolved to its commit before the download
        "endpoint": "http://hub-mirror.internal:8080",
        "token": TOKEN,
    }
    assert TOKEN not in out  # no_log: the token never reaches the output
    current = rig["models"] / "current"
    target = Path(os.readlink(current))
    assert target.parent == rig["models"] and target.name.startswith("google-w4a16-")
    assert sorted(p.name for p in target.iterdir()) == [
        "HUB_SOURCE.json",
        "MANIFEST.sha256",
        "config.json",
        "model.safetensors",
        "sub",
    ]
    check = subprocess.run(["sha256sum", "--check", "--strict", "MANIFEST.sha256"], cwd=target)
    assert check.returncode == 0
    assert (rig["tmp"] / "restarted").exists()
    assert not list(rig["models"].glob("*.partial"))

    rc, tasks, out = converge(rig)
    assert rc == 0, out[-5000:]
    assert [t for t in tasks if t.get("changed")] == []
    assert not (rig["tmp"] / "restarted").exists()


def test_failed_pull_redacts_the_token_and_switches_nothing(rig: dict[str, Path]) -> None:
    rc, _, out = converge(rig, token="bad")
    assert rc != 0
    assert "401 Unauthorized for token *** at google/gemma-4-E2B-it-qat-w4a16-ct" in out
    assert "token bad" not in out
    assert not (rig["models"] / "current").exists()
