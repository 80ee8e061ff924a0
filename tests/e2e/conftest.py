"""The local rig, stood up once per session from nothing by site.yml and shared by e2e tests.

Test files run in name order: test_00_site (bring-up, re-run, check mode), then the tests that
use the running rig, then test_99_teardown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.ansible_run import PlaybookRun, run_playbook
from tests.e2e.rig import podman, rig_containers

CONTAINER = "gemma-rig"
PORT = 8000
MODEL = "tiny-emb4"


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
