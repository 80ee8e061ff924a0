"""The repack role fetches Google's QAT release when rig_qat_source_dir is absent: playbooks/repack.yml
by real ansible-playbook on localhost, against the stand-in hub (tests/stand_in_hub.py) serving a
tiny QAT-like release. Check mode only says it would fetch; a real run fetches, verifies and builds;
a refusal is the fetcher's one line naming repack_hub_token, the token never shown; with fetching
off, the missing directory is named.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from repack.make_tiny_qat import build
from tests.conftest import ROOT, VENV_BIN
from tests.stand_in_hub import StandInHub

REPO = "google/gemma-4-E2B-it-qat-q4_0-unquantized"  # the role's default repack_hub_repo
TOKEN = "hf_roleTESTtokenGranted0042"
OTHER = "hf_roleTESTtokenNotGranted0042"


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The tiny QAT-like release's files, as the hub would hold them (17 MiB)."""
    src = tmp_path_factory.mktemp("release") / "qat"
    build(src, seed=0, with_shared_kv=False, force=False)
    return {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}


@pytest.fixture
def hub(release: dict[str, bytes]) -> Iterator[StandInHub]:
    with StandInHub(REPO, release, tokens=(TOKEN, OTHER), granted=(TOKEN,)) as h:
        yield h


def play(tmp_path: Path, hub: StandInHub, *args: str, **evars: object) -> tuple[int, str]:
    """playbooks/repack.yml for the emb4 entry, its source in tmp_path; variables from a 0600 file."""
    vars_file = tmp_path / "vars.json"
    vars_file.touch(mode=0o600)
    base = {
        "repack_model": "emb4",
        "rig_controller_build_dir": str(tmp_path / "build"),
        "rig_qat_source_dir": str(tmp_path / "sources" / "qat"),
        "repack_hub_endpoint": hub.endpoint,
        "repack_hub_token": TOKEN,
        "repack_jobs": 1,
    }
    vars_file.write_text(json.dumps({**base, **evars}))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "HF_HOME": str(tmp_path / "hf-home")}
    env.pop("HF_TOKEN", None)
    res = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "playbooks/repack.yml", "-e", f"@{vars_file}", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return res.returncode, " ".join((res.stdout + res.stderr).split())  # the yaml callback wraps lines


def test_check_mode_says_it_would_fetch_and_fetches_nothing(hub: StandInHub, tmp_path: Path) -> None:
    rc, out = play(tmp_path, hub, "--check")
    assert rc == 0, out[-3000:]
    assert f"check mode: would fetch {REPO}@main into {tmp_path}/sources/qat" in out
    assert hub.log == []
    assert not (tmp_path / "sources").exists() and not (tmp_path / "build" / "models" / "emb4").exists()


def test_a_real_run_fetches_verifies_and_builds(
    hub: StandInHub, tmp_path: Path, release: dict[str, bytes]
) -> None:
    rc, out = play(tmp_path, hub, "-v")
    assert rc == 0, out[-3000:]
    source = tmp_path / "sources" / "qat"
    assert {p.name for p in source.iterdir()} == {*release, "fetch.json"}
    assert all((source / name).read_bytes() == data for name, data in release.items())
    assert f"{REPO}@main is at {source}: {len(release)} files, all verified" in out
    assert TOKEN not in out
    assert all(r.authorization in ("", f"Bearer {TOKEN}") for r in hub.log)  # the token reached the hub
    stamp = json.loads((tmp_path / "build" / "models" / "emb4" / "repack.json").read_text())
    assert stamp["source"] == str(source.resolve())
    # Again: the release is there, nothing is fetched or built.
    hub.log.clear()
    rc, out = play(tmp_path, hub)
    assert rc == 0, out[-3000:]
    assert hub.log == [] and "changed=0" in out


def test_a_refusal_names_the_repo_and_the_variable(hub: StandInHub, tmp_path: Path) -> None:
    rc, out = play(tmp_path, hub, "-vvv", repack_hub_token=OTHER)
    assert rc != 0
    assert (
        f"fetch: error: the hub refused {REPO} (403: Access to model {REPO} is restricted and you are not in "
        f"the authorized list. Visit {hub.endpoint}/{REPO} to ask for access.); "
        f"put a token with access to {REPO} in repack_hub_token"
    ) in out
    assert OTHER not in out
    assert not (tmp_path / "sources" / "qat").exists()


def test_with_fetching_off_the_missing_source_is_named(hub: StandInHub, tmp_path: Path) -> None:
    rc, out = play(tmp_path, hub, repack_fetch=False)
    assert rc != 0
    assert (
        f"the QAT source of emb4 is not at {tmp_path}/sources/qat (no config.json); put Google's "
        f"gemma-4-E2B-it-qat-q4_0-unquantized there, set rig_qat_source_dir, or set repack_fetch=true "
        f"to fetch {REPO}"
    ) in out
    assert hub.log == []
