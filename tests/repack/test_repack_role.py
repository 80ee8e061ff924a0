"""playbooks/repack.yml builds a catalog entry once, then skips it while it is up to date."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _play(build_dir: Path, key: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            str(ROOT / "playbooks/repack.yml"),
            "-e",
            f"repack_model={key}",
            "-e",
            f"rig_controller_build_dir={build_dir}",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def _changed(out: str) -> int:
    return int(re.search(r"localhost\s+:.*changed=(\d+)", out).group(1))


def test_builds_then_skips(tmp_path):
    first = _play(tmp_path, "tiny-emb4")
    assert first.returncode == 0, first.stdout[-3000:]
    assert _changed(first.stdout) >= 2  # tiny source made, checkpoint built
    out = tmp_path / "models" / "tiny-emb4"
    stamp = json.loads((out / "repack.json").read_text())
    assert stamp["steps"] == ["repack", "text_only", "embed_int4+embed_tokens"]
    assert stamp["source"] == str((tmp_path / "models" / "tiny-qat").resolve())
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    second = _play(tmp_path, "tiny-emb4")
    assert second.returncode == 0, second.stdout[-3000:]
    assert _changed(second.stdout) == 0
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_unknown_key_fails_naming_the_valid_keys(tmp_path):
    r = _play(tmp_path, "no-such-model")
    assert r.returncode != 0
    assert "no-such-model" in r.stdout and "tiny-emb4" in r.stdout
    assert not (tmp_path / "models").exists()


def test_hub_entry_is_refused(tmp_path):
    r = _play(tmp_path, "bf16")
    assert r.returncode != 0 and "kind: repack" in r.stdout


def test_jobs_reach_the_converter_only_when_set(tmp_path):
    # 0 (the default) leaves the converter's own default, every CPU; N > 0 passes --jobs N.
    default = _play(tmp_path / "a", "tiny-emb4", "-v")
    assert default.returncode == 0, default.stdout[-3000:]
    assert "- --force" in default.stdout and "- --jobs" not in default.stdout  # the argv, as -v shows it
    one = _play(tmp_path / "b", "tiny-emb4", "-v", "-e", "repack_jobs=1")
    assert one.returncode == 0, one.stdout[-3000:]
    assert re.search(r"- --jobs\n\s*- '?1'?\n", one.stdout), one.stdout[-3000:]
