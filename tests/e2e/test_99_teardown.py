"""teardown.yml removes the local rig: nothing is left running, and the base images stay."""

from __future__ import annotations

import pytest

from tests.ansible_run import run_playbook
from tests.e2e.rig import podman, rig_containers

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "none"  # teardown works from any state


def test_teardown_leaves_nothing_running(local_rig) -> None:
    run = run_playbook("teardown.yml")
    assert run.rc == 0, run.output[-6000:]
    assert rig_containers() == []
    assert podman("volume", "exists", f"{local_rig.container}-data").returncode != 0
    assert podman("image", "exists", "localhost/gemma-rig-base:bookworm").returncode == 0
    again = run_playbook("teardown.yml")
    # rig-local is in the recap, and no host changed anything.
    assert again.rc == 0 and again.total("changed", hosts=["rig-local"]) == again.total("changed") == 0, (
        again.output[-6000:]
    )
