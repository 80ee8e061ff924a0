"""The local rig, stood up once per session from nothing by site.yml and shared by e2e tests.

Test files run in name order: test_00_site (bring-up, re-run, check mode), then the tests that
use the running rig, then test_99_teardown. Each file declares the rig state it starts from
(`RIG_START`), and `rig_start` checks it before the file's first test: no file silently depends on
what the one before it left.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.ansible_run import PlaybookRun, run_playbook
from tests.e2e.rig import assert_closed, assert_serving, podman, rig_containers

CONTAINER = "gemma-rig"
PORT = 8000
MODEL = "tiny-emb4"

# The start states a file can declare in `RIG_START` (CONTRIBUTING.md, "Skips and the e2e order").
NONE = "none"  # no expectation: the file stands the rig up (test_00) or removes it (test_99)
DEFAULT = "default"  # as site.yml leaves it: active, serving tiny-emb4 (checked at the source), closed
START_STATES = (NONE, DEFAULT)


@dataclass
class LocalRig:
    """What the e2e tests know about the rig site.yml stood up."""

    container: str
    port: int
    model: str
    bring_up: PlaybookRun


@pytest.fixture(scope="session")
def local_rig() -> LocalRig:
    """Stand up the local rig from no container at all, with plain `ansible-playbook site.yml`.

    RIG_E2E_REUSE=1 keeps a rig that is already there (site.yml then only converges it): for a
    developer's inner loop, never for CI.
    """
    if not os.environ.get("RIG_E2E_REUSE"):
        for name in rig_containers():
            podman("rm", "-f", name)
        podman("volume", "rm", "-f", f"{CONTAINER}-data")
        assert CONTAINER not in rig_containers()
    run = run_playbook("site.yml")
    assert run.rc == 0, run.output[-6000:]
    return LocalRig(CONTAINER, PORT, MODEL, run)


@pytest.fixture(scope="module", autouse=True)
def rig_start(request: pytest.FixtureRequest) -> None:
    """Check, before a file's first test, the rig state the file declares in RIG_START."""
    start = getattr(request.module, "RIG_START", None)
    assert start in START_STATES, f"{request.module.__name__} declares no RIG_START (one of {START_STATES})"
    if start == NONE:
        return
    rig: LocalRig = request.getfixturevalue("local_rig")
    assert_serving(rig.container, rig.port, rig.model)
    assert_closed(rig.container)
