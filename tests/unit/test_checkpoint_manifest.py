"""roles/checkpoint/files/manifest.py: the manifest the push, the resume and the verify rely on."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

TOOL = ROOT / "roles" / "checkpoint" / "files" / "manifest.py"


def run(*args: str | Path) -> tuple[int, dict, str]:
    res = subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True)
    return res.returncode, (json.loads(res.stdout) if res.stdout.strip() else {}), res.stderr


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "tokenizer").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    (src / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    (src / "tokenizer" / "tokenizer.json").write_text("{}")
    (src / ".cache").mkdir()
    (src / ".cache" / "lock").write_text("hub client state, not part of the checkpoint")
    return src


def test_make_writes_sha256sum_format_once(checkpoint: Path) -> None:
    rc, out, _ = run("make", checkpoint)
    assert rc == 0 and out["changed"]
    text = (checkpoint / "MANIFEST.sha256").read_text()
    expected = {
        rel: hashlib.sha256((checkpoint / rel).read_bytes()).hexdigest()
        for rel in ("config.json", "model.safetensors", "tokenizer/tokenizer.json")
    }
    assert text == "".join(f"{expected[rel]}  {rel}\n" for rel in sorted(expected))
    assert out["version"] == hashlib.sha256(text.encode()).hexdigest()[:12]
    assert [f["path"] for f in out["files"]] == sorted(expected)
    # `sha256sum -c` agrees (the format is the standard one).
    assert (
        subprocess.run(["sha256sum", "--check", "--strict", "MANIFEST.sha256"], cwd=checkpoint).returncode
        == 0
    )
    rc, again, _ = run("make", checkpoint)
    assert rc == 0 and not again["changed"] and again["version"] == out["version"]


def test_version_follows_content(checkpoint: Path) -> None:
    first = run("make", checkpoint)[1]["version"]
    (checkpoint / "config.json").write_text('{"a": 2}')
    assert run("make", checkpoint)[1]["version"] != first


def test_need_lists_missing_and_corrupt_files_only(checkpoint: Path, tmp_path: Path) -> None:
    run("make", checkpoint)
    manifest = checkpoint / "MANIFEST.sha256"
    dest = tmp_path / "dest"
    assert run("need", dest, manifest)[1]["need"] == [
        "config.json",
        "model.safetensors",
        "tokenizer/tokenizer.json",
    ]
    (dest / "tokenizer").mkdir(parents=True)
    (dest / "config.json").write_text('{"a": 1}')  # already sent
    (dest / "model.safetensors").write_bytes(b"half a file")  # interrupted
    (dest / "tokenizer" / "tokenizer.json").write_text("{}")
    rc, out, _ = run("need", dest, manifest)
    assert rc == 0 and out["need"] == ["model.safetensors"] and out["have"] == 2


def test_verify(checkpoint: Path) -> None:
    run("make", checkpoint)
    assert run("verify", checkpoint)[0] == 0
    (checkpoint / "model.safetensors").write_bytes(b"corrupt")
    rc, out, err = run("verify", checkpoint)
    assert rc == 1 and out["bad"] == ["model.safetensors"] and "model.safetensors" in err


@pytest.mark.parametrize("line", ["nothex  a\n", f"{'0' * 64}  ../escape\n", f"{'0' * 64} /abs\n"])
def test_malformed_manifest_is_refused(tmp_path: Path, line: str) -> None:
    (tmp_path / "MANIFEST.sha256").write_text(line)
    rc, _, err = run("verify", tmp_path)
    assert rc == 2 and "malformed" in err


def test_make_refuses_missing_or_empty_dir(tmp_path: Path) -> None:
    assert "does not exist" in run("make", tmp_path / "nope")[2]
    (tmp_path / "empty").mkdir()
    assert "holds no files" in run("make", tmp_path / "empty")[2]


def test_plan_resumes_a_partial_file_and_removes_what_rsync_would_skip(
    checkpoint: Path, tmp_path: Path
) -> None:
    _, made, _ = run("make", checkpoint)
    files = {f["path"]: f for f in made["files"]}
    staging = tmp_path / "staging"
    (staging / "tokenizer").mkdir(parents=True)
    weights = (checkpoint / "model.safetensors").read_bytes()
    (staging / "model.safetensors").write_bytes(weights[:300000])  # an interrupted file
    (staging / "config.json").write_text('{"a": 2}')  # as long as the source, but wrong
    (staging / "tokenizer" / "tokenizer.json").write_text("{}")  # complete
    (staging / ".model.safetensors.Ab12Cd").write_bytes(b"x" * 10)  # a killed transfer's temp file
    rc, out, err = run("plan", staging, json.dumps(made["files"]))
    assert rc == 0, err
    assert out["need"] == ["config.json", "model.safetensors"]
    assert out["remove"] == [".model.safetensors.Ab12Cd", "config.json"]
    assert out["resumed"] == 300000
    assert out["to_send"] == files["config.json"]["size"] + len(weights) - 300000
    assert out["free"] > 0


def test_plan_of_a_staging_dir_not_made_yet_counts_everything(checkpoint: Path, tmp_path: Path) -> None:
    _, made, _ = run("make", checkpoint)
    rc, out, _ = run("plan", tmp_path / "models" / "x.partial", json.dumps(made["files"]))
    assert rc == 0
    assert out["to_send"] == made["bytes"] and out["resumed"] == 0
    assert out["free"] > 0  # read from the nearest directory that exists


def test_plan_refuses_a_bad_file_list(tmp_path: Path) -> None:
    rc, _, err = run("plan", tmp_path, '[{"path": "a"}]')
    assert rc == 2 and "FILES is not a JSON list of {path, size, sha256}" in err
