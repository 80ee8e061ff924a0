"""After a swap the rig serves another model than the inventory's rig_model: query.yml asks the
model that is served (not a 404 for the inventory's), and status.yml says which it is and that the
inventory differs. The rig is swapped back at the end."""

from __future__ import annotations

import pytest

from tests.ansible_run import run_playbook
from tests.e2e.rig import served_models

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

OTHER = "tiny-w8a8"


def test_query_and_status_follow_the_served_model(local_rig) -> None:
    swap = run_playbook("swap.yml", "-e", f"model={OTHER}")
    assert swap.rc == 0, swap.output[-6000:]
    try:
        assert served_models(local_rig.port) == [OTHER]
        query = run_playbook("playbooks/query.yml", "-e", "max_tokens=16")
        assert query.rc == 0, query.output[-6000:]
        assert f"{OTHER}: " in query.output and "does not exist" not in query.output
        status = run_playbook("playbooks/status.yml")
        assert status.rc == 0, status.output[-6000:]
        assert (
            f"model: {OTHER} (the inventory says {local_rig.model}: swapped since site.yml)" in status.output
        )
    finally:
        back = run_playbook("swap.yml", "-e", f"model={local_rig.model}")
        assert back.rc == 0, back.output[-6000:]
    assert served_models(local_rig.port) == [local_rig.model]
