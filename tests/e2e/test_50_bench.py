"""bench.yml and accuracy.yml against the local rig that site.yml stood up (reduced grid).

The same playbooks run on a gce rig with the full grid; here the grid is cut to one cell of each
kind (tests/bench_grid.py RIG_GRID: the sweep itself is tests/controller/test_bench.py's), with
cells the rig cannot run (concurrency above its max-num-seqs 4, input above its max-model-len
2048) to prove they are recorded, not dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence.mcdata import TINY_FACTS_OUT
from evidence.report import validate
from tests.ansible_run import run_playbook
from tests.bench_grid import RIG_GRID
from tests.e2e.rig import assert_serving

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start


def test_bench_on_the_local_rig_records_a_run(local_rig, tmp_path: Path, figure) -> None:
    serving = assert_serving(local_rig.container, local_rig.port, local_rig.model)
    runs = tmp_path / "runs"
    run = run_playbook(
        "playbooks/bench.yml",
        extra_vars={**RIG_GRID, "bench_run_id": "local-e2e", "bench_runs_dir": str(runs),
                    "bench_fetch_root": str(tmp_path / "fetched"), "bench_update_index": False},
        timeout=1800,
    )  # fmt: skip
    assert run.rc == 0, run.output[-6000:]
    figure("bench.yml, reduced grid on the local rig", f"{run.seconds:.0f} s")
    assert "cell 4/4: input 4096, concurrency 8" in run.output
    out = runs / "local-e2e"
    rec = json.loads((out / "run.json").read_text())
    validate(rec)
    assert rec["hardware"]["platform"] == "local"
    # Labelled with what the rig serves, checked at the source before the run and after it: the
    # same start of the unit (one invocation) served the whole run, so the record measured it.
    assert rec["model"]["key"] == rec["model"]["served_name"] == serving.key
    assert assert_serving(local_rig.container, local_rig.port, serving.key) == serving
    assert rec["provenance"]["kind"] == "measured"
    # From the unit's journal (this start only): version, KV cache, the tiny model's settings.
    assert rec["software"]["vllm_version"] == "0.29.0"
    assert rec["memory"]["kv_cache_tokens"] > 0
    assert rec["software"]["non_default_args"]["max_num_seqs"] == 4
    assert rec["software"]["server_settings"]["RIG_MAX_NUM_SEQS"] == "4"
    # The engine's resolved setting, read from the log: the rig passes no prefix-caching flag, so
    # vLLM's default (on) is what the engine ran with; None would mean the line was not read.
    assert rec["bench"]["prefix_caching"] is True
    cells = {(c["input_len"], c["concurrency"]): c for c in rec["bench"]["cells"]}
    assert len(cells) == 4
    assert cells[(128, 1)]["status"] == "ok"
    assert cells[(128, 8)]["status"] == "infeasible"
    assert all(cells[(4096, c)]["status"] == "infeasible" for c in (1, 8))
    assert rec["bench"]["decode"]["status"] == "ok"
    assert "infeasible" in (out / "REPORT.md").read_text()
    for png in ("throughput.png", "ttft.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    figure(
        "local rig, tiny-emb4, c=1 input 128",
        f"{cells[(128, 1)]['median']['output_tok_s']:.1f} output tok/s, "
        f"TTFT {cells[(128, 1)]['median']['ttft_ms']:.0f} ms",
    )


def test_accuracy_on_the_local_rig_against_itself_is_zero(local_rig, tmp_path: Path, figure) -> None:
    serving = assert_serving(local_rig.container, local_rig.port, local_rig.model)
    fetch = tmp_path / "acc"
    first = run_playbook(
        "playbooks/accuracy.yml", extra_vars={"accuracy_fetch_root": str(fetch)}, timeout=1800
    )
    assert first.rc == 0, first.output[-6000:]
    scores = fetch / f"rig-local-{serving.key}.json"
    data = json.loads(scores.read_text())
    assert data["model"] == serving.key  # labelled with what the rig serves, checked at the source
    # A tiny build is asked its own facts, by letter: the trained model knows every one.
    assert len(data["scores"]) == len(TINY_FACTS_OUT.read_text().splitlines())
    kept = tmp_path / "first.json"
    kept.write_text(scores.read_text())
    again = run_playbook(
        "playbooks/accuracy.yml",
        extra_vars={"accuracy_fetch_root": str(fetch), "accuracy_compare_with": str(kept)},
        timeout=1800,
    )
    assert again.rc == 0, again.output[-6000:]
    res = json.loads((fetch / f"rig-local-{serving.key}.compare.json").read_text())
    assert assert_serving(local_rig.container, local_rig.port, serving.key) == serving  # one start, both runs
    assert (res["diff"], res["ci_low"], res["ci_high"]) == (0.0, 0.0, 0.0)
    assert res["acc_a"] == res["acc_b"] == 100.0
    figure("accuracy, local rig build against itself", f"{res['acc_a']:.1f}% both, +0.0 (+0.0 to +0.0)")
