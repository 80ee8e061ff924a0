"""repack/fetch.py against the stand-in hub (tests/stand_in_hub.py): real huggingface_hub, no internet.

A full fetch lands verified at DEST; a connection cut mid-file is resumed with a Range request; a
stopped run keeps its complete files for the next; a file damaged on the wire or on disk is
caught by its hash and fetched again; 401, 403, an unknown repo and a wrong revision each give one
line (exit 2) naming the repository and the token variable, and leave nothing at DEST.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from repack import fetch as fetch_mod
from repack.fetch import FetchError, fetch
from tests.conftest import ROOT, VENV_BIN
from tests.stand_in_hub import COMMIT, StandInHub

REPO = "google/gemma-4-E2B-it-qat-q4_0-unquantized"
GRANTED, OTHER = "hf_granted", "hf_valid_but_not_granted"
FILES = {
    "config.json": b'{"model_type": "gemma4"}',
    "model-00001-of-00002.safetensors": bytes(range(256)) * 1024,  # 256 KiB: LFS, through the blob store
    "model-00002-of-00002.safetensors": hashlib.sha256(b"two").digest() * 4096,  # 128 KiB: LFS
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',  # small: git blob id, in a subdirectory
}
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(autouse=True)
def _no_stored_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No token of this machine's (HF_HOME, HF_TOKEN) reaches the stand-in; small download chunks.

    huggingface_hub writes what it receives in chunks of 10 MiB; 64 KiB lets a cut in a file of
    256 KiB leave bytes behind to resume from, as a cut in a 4 GB shard does with 10 MiB chunks.
    """
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE", 64 * 1024)


@pytest.fixture
def hub() -> Iterator[StandInHub]:
    with StandInHub(REPO, dict(FILES), tokens=(GRANTED, OTHER), granted=(GRANTED,), page_size=2) as h:
        yield h


def run(
    hub: StandInHub, dest: Path, token: str | None = GRANTED, revision: str = "main", **kw: object
) -> dict:
    lines: list[str] = []
    summary = fetch(
        REPO, revision, dest, token=token, token_name="HF_TOKEN", endpoint=hub.endpoint, quiet=True,
        say=kw.pop("say", lines.append), **kw,
    )  # fmt: skip
    summary["lines"] = lines
    return summary


def assert_complete(dest: Path) -> None:
    assert {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} == {*FILES, "fetch.json"}
    for name, data in FILES.items():
        assert (dest / name).read_bytes() == data
    assert not (dest / ".cache").exists()
    assert not (dest.parent / f".{dest.name}.partial").exists()


def test_a_full_fetch_is_verified_and_stamped(hub: StandInHub, tmp_path: Path) -> None:
    dest = tmp_path / "qat"
    out = run(hub, dest)
    assert out["changed"] and out["commit"] == COMMIT and out["files"] == 4
    assert out["bytes"] == sum(map(len, FILES.values()))
    assert_complete(dest)
    stamp = json.loads((dest / "fetch.json").read_text())
    assert stamp["repo"] == REPO and stamp["commit"] == COMMIT
    assert stamp["files"][SHARD]["sha256"] == hashlib.sha256(FILES[SHARD]).hexdigest()
    assert stamp["files"]["config.json"]["sha256"] is None  # small files: the git blob id
    # One line a file, with the check it passed and the bytes so far.
    assert f"[2/4] {SHARD}: 0.2 MiB, sha256 verified; 0.3 MiB of 0.4 MiB" in out["lines"], out["lines"]
    assert any("tokenizer/tokenizer.json" in ln and "git blob id verified" in ln for ln in out["lines"])
    # The listing came in pages (page_size 2), the blobs from the blob store without the token.
    assert sum("/tree/" in r.path for r in hub.log) == 3
    assert all(r.authorization == "" for r in hub.gets(SHARD))
    # Again: already there, nothing downloaded.
    before = len(hub.log)
    again = run(hub, dest)
    assert {k: again[k] for k in ("changed", "files", "bytes")} == {
        "changed": False,
        "files": 4,
        "bytes": out["bytes"],
    }
    assert [r.path for r in hub.log[before:]] == [f"/api/models/{REPO}/revision/main"]  # the revision alone


def test_a_cut_connection_is_resumed_not_restarted(hub: StandInHub, tmp_path: Path) -> None:
    hub.cut_once.add(SHARD)
    dest = tmp_path / "qat"
    run(hub, dest)
    assert_complete(dest)
    first, second = hub.gets(SHARD)
    assert first.range == ""
    # The stand-in sent half (128 KiB) before it hung up: the client kept what it had and asked for
    # the rest, from a multiple of its 64 KiB chunk.
    kept = int(second.range.removeprefix("bytes=").removesuffix("-"))
    assert second.range == f"bytes={kept}-" and kept == 128 * 1024


def test_a_stopped_run_keeps_its_complete_files(hub: StandInHub, tmp_path: Path) -> None:
    class Stop(Exception):
        pass

    def stop_after_two(line: str) -> None:
        if line.startswith("[2/4]"):
            raise Stop

    dest = tmp_path / "qat"
    with pytest.raises(Stop):
        run(hub, dest, say=stop_after_two)
    assert not dest.exists()  # nothing half-done at DEST
    assert (tmp_path / ".qat.partial" / SHARD).read_bytes() == FILES[SHARD]
    out = run(hub, dest)
    assert_complete(dest)
    assert len(hub.gets(SHARD)) == 1 and len(hub.gets("config.json")) == 1  # not fetched twice
    assert any(SHARD in ln and "kept from an earlier run" in ln for ln in out["lines"])


def test_a_file_damaged_on_the_wire_is_fetched_again(hub: StandInHub, tmp_path: Path) -> None:
    hub.corrupt_once.update({SHARD, "config.json"})
    dest = tmp_path / "qat"
    out = run(hub, dest)
    assert_complete(dest)
    assert len(hub.gets(SHARD)) == 2 and len(hub.gets("config.json")) == 2
    warned = [ln for ln in out["lines"] if "fetching it again" in ln]
    assert len(warned) == 2
    assert any(f"{SHARD}: sha256 " in ln and "the hub lists" in ln for ln in warned)
    assert any("config.json: git blob id " in ln for ln in warned)


def test_a_file_damaged_on_disk_is_fetched_again(hub: StandInHub, tmp_path: Path) -> None:
    staging = tmp_path / ".qat.partial"
    with pytest.raises(FetchError):
        run(hub, tmp_path / "qat", token=GRANTED, revision="main", say=_stop_at("[3/4]"))
    damaged = bytearray((staging / SHARD).read_bytes())
    damaged[1000] ^= 1
    (staging / SHARD).write_bytes(bytes(damaged))  # same size: only the hash can tell
    (staging / "stray.bin").write_bytes(b"from a stopped fetch of another commit")
    out = run(hub, tmp_path / "qat")
    assert_complete(tmp_path / "qat")
    assert len(hub.gets(SHARD)) == 2 and len(hub.gets("config.json")) == 1
    assert any(SHARD in ln and "sha256 verified" in ln and "kept" not in ln for ln in out["lines"])


def _stop_at(prefix: str):
    def say(line: str) -> None:
        if line.startswith(prefix):
            raise FetchError("stopped by the test")

    return say


def test_a_file_damaged_every_time_stops_the_run(hub: StandInHub, tmp_path: Path, monkeypatch) -> None:
    real = fetch_mod.listing

    def lying(api: object, repo: str, commit: str) -> list[fetch_mod.Expected]:
        return [
            fetch_mod.Expected(e.path, e.size, "0" * 64, e.git_oid) if e.path == SHARD else e
            for e in real(api, repo, commit)
        ]

    monkeypatch.setattr(fetch_mod, "listing", lying)
    with pytest.raises(FetchError) as err:
        run(hub, tmp_path / "qat")
    assert f"{SHARD} fails verification twice (sha256 " in str(err.value)
    assert not (tmp_path / "qat").exists()
    assert len(hub.gets(SHARD)) == 2


@pytest.mark.parametrize(
    ("token", "status", "said"),
    [
        (None, 401, f"Access to model {REPO} is restricted. You must have access to it"),
        ("hf_unknown", 401, "Invalid credentials in Authorization header"),
        (OTHER, 403, f"Access to model {REPO} is restricted and you are not in the authorized list"),
    ],
    ids=["no-token", "bad-token", "no-access"],
)
def test_refusals_are_one_line_naming_repo_and_token(
    hub: StandInHub, tmp_path: Path, token: str | None, status: int, said: str
) -> None:
    with pytest.raises(FetchError) as err:
        run(hub, tmp_path / "qat", token=token)
    msg = str(err.value)
    assert err.value.code == 2 and "\n" not in msg
    assert msg.startswith(f"the hub refused {REPO} ({status}: {said}")
    assert msg.endswith(f"put a token with access to {REPO} in HF_TOKEN")
    assert not list(tmp_path.iterdir())  # nothing written


def test_an_unknown_repo_and_a_wrong_revision_are_named(hub: StandInHub, tmp_path: Path) -> None:
    with pytest.raises(FetchError) as err:
        run(hub, tmp_path / "qat", revision="v9")
    assert err.value.code == 2 and str(err.value) == f"{REPO} has no revision 'v9' (a branch, tag or commit)"
    with pytest.raises(FetchError) as err:
        fetch(
            "google/no-such",
            "main",
            tmp_path / "x",
            token=GRANTED,
            token_name="HF_TOKEN",
            endpoint=hub.endpoint,
        )
    assert err.value.code == 2 and "no repository google/no-such that HF_TOKEN can see" in str(err.value)
    assert not list(tmp_path.iterdir())


def test_a_commit_revision_and_an_existing_dest(hub: StandInHub, tmp_path: Path) -> None:
    out = run(hub, tmp_path / "qat", revision=COMMIT)
    assert out["commit"] == COMMIT
    assert_complete(tmp_path / "qat")
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(FetchError) as err:
        run(hub, other)
    assert err.value.code == 2 and f"{other} exists and is not a fetch of {REPO}" in str(err.value)


def cli(
    hub: StandInHub, tmp_path: Path, *args: str, stdin: str = "", **env: str
) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), **env}
    environ.pop("HF_TOKEN", None) if "HF_TOKEN" not in env else None
    return subprocess.run(
        [str(VENV_BIN / "python"), "-m", "repack.fetch", "--repo", REPO, "--dest", str(tmp_path / "qat"), *args],
        cwd=ROOT, env=environ, input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_cli(hub: StandInHub, tmp_path: Path) -> None:
    help_ = subprocess.run([str(VENV_BIN / "python"), "-m", "repack.fetch", "--help"], cwd=ROOT,
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert "--token-env VAR" in help_.stdout and "--revision" in help_.stdout
    # A refusal: one line on stderr naming the repo and the variable, exit 2.
    res = cli(hub, tmp_path, "--token-env", "MY_HUB_TOKEN", MY_HUB_TOKEN=OTHER)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"fetch: error: the hub refused {REPO} (403: Access to model {REPO} is restricted and you are not in "
        f"the authorized list. Visit {hub.endpoint}/{REPO} to ask for access.); "
        f"put a token with access to {REPO} in MY_HUB_TOKEN"
    ]
    # The token on stdin, named as the role names it; a JSON summary on stdout.
    res = cli(hub, tmp_path, "--token-stdin", "--token-name", "repack_hub_token", "-q", stdin=GRANTED + "\n")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1]) == {
        "changed": True, "commit": COMMIT, "files": 4, "bytes": sum(map(len, FILES.values()))
    }  # fmt: skip
    assert "fetch: [4/4]" in res.stderr
