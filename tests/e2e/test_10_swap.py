"""swap.yml on the local rig: an unknown key fails before anything on the rig is touched.

The swaps themselves are test_25_gateway's, on the same rig (rig-local) and the next rig beside
it, so each costs its vLLM starts once:
- to W8A8 (the lossy build) answering the tiny model's facts: its rolling swap of both rigs;
- a broken checkpoint rolled back to the very checkpoint served before: its broken model, which
  stops the rollout at rig-local;
- back to the default (emb4, every fact) with plain `swap.yml`, downtime reported: its last test.
Every other build answering its facts with the rig's flags (the local profile's and the catalog's
vllm_args) is tests/repack/test_vllm.py's, in the same vLLM CPU build.
"""

from __future__ import annotations

import pytest

from tests.ansible_run import run_playbook
from tests.e2e.rig import unit_started_at

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start


def test_unknown_key_fails_fast_and_touches_nothing(local_rig) -> None:
    started = unit_started_at(local_rig.container)
    run = run_playbook("swap.yml", "-e", "model=no-such-model")
    assert run.rc != 0
    assert "model 'no-such-model' is not in the catalog (rig_models); valid keys:" in run.output
    assert "tiny-w8a8" in run.output and "tiny-emb4" in run.output  # the valid keys are listed
    assert "rig-local" not in run.recap  # the rig's play never started
    assert unit_started_at(local_rig.container) == started
