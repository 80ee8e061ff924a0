"""swap.yml on the local rig: to W8A8 (the lossy build) answering the tiny model's facts, a broken
checkpoint rolls back, an unknown key fails before anything on the rig is touched. The rig is left
serving what it served before (emb4, which answers the facts too).

Every other build answering its facts with the rig's flags (the local profile's and the catalog's
vllm_args) is tests/repack/test_vllm.py's, in the same vLLM CPU build: a swap here costs a minute
and proves the swap, which one build shows.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from repack.tiny_facts import FACTS
from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT
from tests.e2e.rig import assert_serving, chat, fact_misses, served_models, unit_started_at

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start


def swap(model: str, *args: str) -> PlaybookRun:
    return run_playbook("swap.yml", "-e", f"model={model}", *args)


def downtime(run: PlaybookRun) -> float:
    found = re.findall(r"downtime ([0-9.]+) s", run.output)
    assert found, run.output[-4000:]
    return float(found[-1])


def test_unknown_key_fails_fast_and_touches_nothing(local_rig) -> None:
    started = unit_started_at(local_rig.container)
    run = swap("no-such-model")
    assert run.rc != 0
    assert "model 'no-such-model' is not in the catalog (rig_models); valid keys:" in run.output
    assert "tiny-w8a8" in run.output and "tiny-emb4" in run.output  # the valid keys are listed
    assert "rig-local" not in run.recap  # the rig's play never started
    assert unit_started_at(local_rig.container) == started


# The share of the tiny model's facts each build must answer exactly as the bf16 source does:
# every one for the lossless int4 build, 90% for W8A8 (int8 rounds the grid's values).
FACTS_NEEDED = {"tiny-emb4": 1.0, "tiny-w8a8": 0.9}


def assert_knows_the_facts(port: int, model: str, figure) -> None:
    """The served build answers the fact set (greedy) as its rule says; misses are listed."""
    misses = fact_misses(port, model)
    right = len(FACTS) - len(misses)
    figure(f"{model} served: facts answered exactly", f"{right}/{len(FACTS)}")
    assert right >= FACTS_NEEDED[model] * len(FACTS), f"{model} missed {len(misses)}: {misses}"


def test_swap_to_w8a8_answers_its_facts(local_rig, figure) -> None:
    """The swapped-to build answers the fact set (emb4: test_swap_back_to_the_default)."""
    model = "tiny-w8a8"
    run = swap(model)
    assert run.rc == 0, run.output[-6000:]
    figure(f"swap to {model}", f"downtime {downtime(run):.1f} s, playbook {run.seconds:.0f} s")
    assert_serving(local_rig.container, local_rig.port, model)
    assert_knows_the_facts(local_rig.port, model, figure)


@pytest.fixture
def broken_catalog(tmp_path: Path, local_rig) -> Path:
    """The catalog plus `tiny-broken`: a checkpoint whose config no longer matches its weights."""
    good = ROOT / "build" / "models" / local_rig.model
    broken = tmp_path / "tiny-broken"
    shutil.copytree(good, broken)
    config = json.loads((broken / "config.json").read_text())
    text = config.get("text_config", config)
    text["hidden_size"] = text["hidden_size"] * 2  # every weight now has the wrong shape
    (broken / "config.json").write_text(json.dumps(config, indent=2))
    catalog = yaml.safe_load((ROOT / "inventory/group_vars/all/models.yml").read_text())
    catalog["rig_models"]["tiny-broken"] = {
        "description": "deliberately broken: hidden_size doubled",
        "source": {"kind": "dir", "path": str(broken)},
        "vllm_args": [],
        "size_bytes": 1,
    }
    path = tmp_path / "catalog.yml"
    path.write_text(yaml.safe_dump({"rig_models": catalog["rig_models"]}))
    return path


def test_broken_checkpoint_rolls_back_to_the_old_model(local_rig, broken_catalog, figure) -> None:
    before = served_models(local_rig.port)[0]
    old = assert_serving(local_rig.container, local_rig.port, before)
    run = swap("tiny-broken", "-e", f"@{broken_catalog}")
    assert run.rc != 0
    assert f"swap {before} -> tiny-broken failed" in run.output, run.output[-6000:]
    assert f"Rolled back: {before} is serving again" in run.output
    # The old checkpoint, the same version, again: what the rollback put back is what served before.
    assert assert_serving(local_rig.container, local_rig.port, before).target == old.target
    assert chat(local_rig.port, before)["usage"]["completion_tokens"] > 0
    figure(
        "failed swap rolled back",
        f"{run.seconds:.0f} s from start to old model answering; slowest tasks: {run.slowest()}",
    )


def test_swap_back_to_the_default(local_rig, figure) -> None:
    run = swap(local_rig.model)
    assert run.rc == 0, run.output[-6000:]
    assert_serving(local_rig.container, local_rig.port, local_rig.model)
    assert_knows_the_facts(local_rig.port, local_rig.model, figure)
