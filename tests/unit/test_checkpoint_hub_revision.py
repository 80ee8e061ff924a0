"""Hub pulls are pinned to a commit and record the commit they got.

The real checkpoint role (real ansible-playbook) pulls with the real huggingface_hub from
tests/stand_in_hub.py, which serves its repository at one commit (``COMMIT``, branch ``main``)
and refuses any other revision as the hub does (404 RevisionNotFound). The catalog entries come in
as rig_models: the rig_catalog lookup checks each entry's revision before anything runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import VENV_BIN
from tests.stand_in_hub import COMMIT, StandInHub
from tests.unit.checkpoint_play import run_play, write_play

pytestmark = pytest.mark.slow  # ansible-playbook runs with a real hub client

REPO = "org/tiny-model"
FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": b"w" * 4096}


@pytest.fixture
def hub() -> Any:
    with StandInHub(REPO, dict(FILES), gated=False) as h:
        yield h


def pull(tmp_path: Path, hub: StandInHub, source: dict[str, Any]) -> tuple[int, str, Path]:
    models = tmp_path / "models"
    play = write_play(tmp_path / "play.yml", {"name": "Restart", "ansible.builtin.debug": {"msg": "restart"}})
    evars = {
        "rig_model": "from-hub",
        "rig_models": {"from-hub": {"description": "a hub entry", "source": {"kind": "hub", "repo": REPO, **source},
                                    "vllm_args": [], "size_bytes": 1}},
        "checkpoint_models_dir": str(models),
        "checkpoint_current_link": str(models / "current"),
        "checkpoint_group": "root",
        "checkpoint_hub_python": str(VENV_BIN / "python"),
        "checkpoint_hub_endpoint": hub.endpoint,
        "checkpoint_hub_token": "",
    }  # fmt: skip
    env = {"HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0"}
    try:
        rc, _, out = run_play(play, evars, env=env)
    except json.JSONDecodeError as exc:  # failed before the play: the output is not the JSON report
        raise AssertionError(str(exc)) from exc
    return rc, out, models / "current"


def recorded(current: Path) -> dict[str, str]:
    """The commit the checkpoint records, checked against its manifest."""
    manifest = (current / "MANIFEST.sha256").read_text()
    assert any(line.endswith("  HUB_SOURCE.json") for line in manifest.splitlines()), manifest
    return json.loads((current / "HUB_SOURCE.json").read_text())


def revision_requests(hub: StandInHub) -> set[str]:
    return {r.path.split("/")[6] for r in hub.log if r.path.startswith(f"/api/models/{REPO}/revision/")}


def test_a_pinned_revision_pulls_that_commit_and_records_it(tmp_path: Path, hub: StandInHub) -> None:
    rc, out, current = pull(tmp_path, hub, {"revision": COMMIT})
    assert rc == 0, out[-5000:]
    assert recorded(current) == {"repo": REPO, "revision": COMMIT, "commit": COMMIT}
    assert (current / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert revision_requests(hub) == {COMMIT}, "a pinned pull never asks for a branch"
    resolves = {r.path.split("/")[4] for r in hub.log if "/resolve/" in r.path}
    assert resolves == {COMMIT}, resolves


def test_an_unpinned_pull_records_the_commit_it_got(tmp_path: Path, hub: StandInHub) -> None:
    rc, out, current = pull(tmp_path, hub, {"revision_unpinned": True})
    assert rc == 0, out[-5000:]
    assert recorded(current) == {"repo": REPO, "revision": "main", "commit": COMMIT}
    assert f"{REPO}@main is commit {COMMIT}" in out


def test_a_commit_the_hub_does_not_have_is_refused(tmp_path: Path, hub: StandInHub) -> None:
    rc, out, current = pull(tmp_path, hub, {"revision": "f" * 40})
    assert rc != 0
    assert "RevisionNotFound" in out or "Invalid rev id" in out, out[-3000:]
    assert not os.path.lexists(current)


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        (
            {"revision": "main"},
            "revision must be a commit (40 lower-case hex digits), not a branch or tag; got 'main'",
        ),
        ({"revision": COMMIT[:7]}, f"not a branch or tag; got '{COMMIT[:7]}'"),  # a short id: ambiguous
        ({"revision": "refs/pr/1"}, "not a branch or tag; got 'refs/pr/1'"),
        ({"revision": COMMIT.upper()}, "not a branch or tag"),
        ({}, "needs a revision (a 40-hex commit) or revision_unpinned: true"),
        ({"revision": COMMIT, "revision_unpinned": True}, "has both a revision and revision_unpinned"),
    ],
)
def test_a_malformed_revision_is_refused_in_one_line(
    tmp_path: Path, hub: StandInHub, source: dict[str, Any], needle: str
) -> None:
    """Hostile: a branch or PR ref (they move), a short id, an unpinned entry not marked so."""
    rc, out, current = pull(tmp_path, hub, source)
    assert rc != 0
    lines = [line for line in out.splitlines() if needle in line]
    assert lines, out[-3000:]
    assert hub.log == [], "nothing reached the hub"
    assert not os.path.lexists(current)
