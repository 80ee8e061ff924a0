"""vllm_service's warm restart on the local rig: a start whose journal lacks the warm-start marker
is followed by exactly one restart, with the KV cache tokens of both starts reported; a warm start
is left alone.

On gce the marker is vLLM's "Directly load AOT compilation" (a start that loaded the compile cache)
and the setting is on (inventory/group_vars/gce.yml). The local CPU build runs eager and never logs
it, so here the test picks the marker: one that no start logs (every start looks cold) and one
that every start logs (every start looks warm).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.e2e.rig import assert_serving, unit_started_at

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start


def play(tmp_path: Path, marker: str) -> Path:
    path = tmp_path / "warm.yml"
    tasks = [
        {
            "name": "Restart once if the start was cold",
            "ansible.builtin.include_role": {"name": "vllm_service", "tasks_from": "warm_restart"},
            "vars": {"vllm_service_warm_marker": marker},
        }
    ]
    path.write_text(yaml.safe_dump([{"hosts": "rig-local", "gather_facts": False, "tasks": tasks}]))
    return path


def test_a_cold_start_is_restarted_once_and_both_kv_sizes_reported(local_rig, tmp_path: Path) -> None:
    cold = assert_serving(local_rig.container, local_rig.port, local_rig.model)
    before = unit_started_at(local_rig.container)
    run = run_playbook(str(play(tmp_path, "a line no vLLM start ever logs")))
    assert run.rc == 0, run.output[-4000:]
    after = unit_started_at(local_rig.container)
    assert after != before
    assert (
        run.output.count("TASK [vllm_service : Restart vLLM (the previous start compiled from scratch)]") == 1
    )
    found = re.search(r"KV cache tokens: cold start ([0-9,]+), after the restart ([0-9,]+)", run.output)
    assert found, run.output[-3000:]
    assert all(int(n.replace(",", "")) > 0 for n in found.groups())
    # The start after the restart serves the same build: read from its own journal, not the cold one's.
    assert assert_serving(local_rig.container, local_rig.port, local_rig.model).invocation != cold.invocation


def test_a_warm_start_is_left_alone(local_rig, tmp_path: Path) -> None:
    before = unit_started_at(local_rig.container)
    run = run_playbook(str(play(tmp_path, "KV cache size")))  # every start logs it: looks warm
    assert run.rc == 0, run.output[-4000:]
    assert run.total("changed") == 0
    assert unit_started_at(local_rig.container) == before
    assert_serving(local_rig.container, local_rig.port, local_rig.model)
