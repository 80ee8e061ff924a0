"""site.yml stands up the local rig from nothing, converges to zero changes, and --check touches nothing."""

from __future__ import annotations

import pytest

from tests.ansible_run import run_playbook
from tests.e2e.rig import assert_serving, chat, unit_started_at

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "none"  # this file stands the rig up


def test_site_stands_up_a_rig_that_answers(local_rig, figure) -> None:
    figure("site.yml from nothing to a healthy rig", f"{local_rig.bring_up.seconds:.0f} s")
    assert_serving(local_rig.container, local_rig.port, local_rig.model)
    answer = chat(local_rig.port, local_rig.model, "What is the capital of France?")
    assert answer["model"] == local_rig.model
    assert answer["usage"]["completion_tokens"] > 0
    assert "curl -s http://127.0.0.1:8000/v1/chat/completions" in local_rig.bring_up.output
    assert "answer:" in local_rig.bring_up.output


def test_second_run_changes_nothing(local_rig, figure) -> None:
    started = unit_started_at(local_rig.container)
    run = run_playbook("site.yml")
    assert run.rc == 0, run.output[-6000:]
    figure("site.yml re-run on a converged rig", f"{run.seconds:.0f} s, changed={run.total('changed')}")
    assert run.total("changed", hosts=["rig-local"]) == 0, run.output[-6000:]
    assert unit_started_at(local_rig.container) == started


def test_check_mode_reports_no_changes_and_touches_nothing(local_rig) -> None:
    started = unit_started_at(local_rig.container)
    run = run_playbook("site.yml", "--check")
    assert run.rc == 0, run.output[-6000:]
    assert run.total("changed", hosts=["rig-local"]) == 0, run.output[-6000:]
    assert unit_started_at(local_rig.container) == started
