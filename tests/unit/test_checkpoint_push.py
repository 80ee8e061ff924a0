"""roles/checkpoint's push, run by real ansible-playbook on this machine: check mode and diff.

The molecule scenario `config` covers the push over the podman connection (resume, keep,
switch); this covers what it cannot: --check on a fresh rig and on a converged one.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.unit.checkpoint_play import run_play, write_play

pytestmark = pytest.mark.slow  # several ansible-playbook runs


def converge(tmp: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    play = write_play(
        tmp / "play.yml", {"name": "Stand-in restart", "ansible.builtin.debug": {"msg": "restart"}}
    )
    evars = {
        "rig_model": "tiny-emb4",
        "checkpoint_models_dir": str(tmp / "models"),
        "checkpoint_current_link": str(tmp / "models" / "current"),
        "checkpoint_source_dir": str(tmp / "src"),
        "checkpoint_group": "root",
    }
    return run_play(play, evars, *args)


def test_check_mode_on_fresh_and_converged_rig(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"\x01" * 100000)
    (src / "sub" / "tokenizer.json").write_text("{}")

    rc, tasks, out = converge(tmp_path, "--check", "--diff")
    assert rc == 0, out[-5000:]
    assert any(t.get("changed") for t in tasks)  # it says what it would do ...
    assert not (tmp_path / "models").exists()  # ... and does nothing on the rig

    rc, _, out = converge(tmp_path)
    assert rc == 0, out[-5000:]
    assert (tmp_path / "models" / "current" / "model.safetensors").read_bytes() == b"\x01" * 100000

    rc, tasks, out = converge(tmp_path, "--check")
    assert rc == 0, out[-5000:]
    assert [t for t in tasks if t.get("changed")] == []


def test_a_push_that_does_not_fit_fails_before_sending_anything(tmp_path: Path) -> None:
    """A 2 MiB tmpfs as the rig's models directory, a 3 MB checkpoint: refused, nothing written."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"\x02" * 3_000_000)
    models = tmp_path / "models"
    models.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(models)], check=False)
    assert mount.returncode == 0, "this test needs root (mount a tmpfs), like the rest of the suite"
    try:
        rc, _, out = converge(tmp_path, "-e", "checkpoint_push_margin_bytes=4096")
        said = " ".join(out.split())
        assert rc != 0
        found = re.search(
            r"not enough space on localhost for tiny-emb4: (\d+) bytes still to send \+ 4096 bytes margin, "
            r"but (\d+) bytes free under " + re.escape(str(models)),
            said,
        )
        assert found, out[-3000:]
        assert int(found.group(1)) == 3_000_002  # the checkpoint, every byte of it still to send
        assert int(found.group(2)) <= 2 * 1024 * 1024
        assert list(models.iterdir()) == []  # no staging directory, no manifest, no byte
    finally:
        subprocess.run(["umount", str(models)], check=False)


def test_missing_source_fails_with_a_hint(tmp_path: Path) -> None:
    rc, _, out = converge(tmp_path)
    assert rc != 0
    assert "holds no checkpoint" in out and "playbooks/checkpoint.yml" in out
    assert not (tmp_path / "models" / "current").exists()
