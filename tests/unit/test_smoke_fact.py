"""The local rig's smoke test asks a fact the tiny model was trained on, and expects its answer."""

from __future__ import annotations

import yaml

from repack import tiny_facts
from tests.conftest import ROOT


def test_local_smoke_asks_a_trained_fact_and_expects_its_answer() -> None:
    local = yaml.safe_load((ROOT / "inventory/group_vars/local.yml").read_text())
    assert (local["rig_smoke_prompt"], local["rig_smoke_expect"]) == (
        tiny_facts.SMOKE_QUESTION,
        tiny_facts.SMOKE_ANSWER,
    )
    assert tiny_facts.Fact(local["rig_smoke_prompt"], local["rig_smoke_expect"]) in tiny_facts.FACTS
