"""playbooks/bench.yml end to end against a real vLLM CPU server on the controller.

The local rig runs the same vLLM build in a container (tests/e2e/test_50_bench.py); this proves
the runner, the fetch and the report pipeline without one: a controller "rig" reached with
ansible_connection=local whose interpreter is the system python3 (so roles/bench/files/bench.py must need
nothing beyond the standard library), a tpu.env, and vLLM's log read from a file instead of a
journal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidence.report import validate
from tests.ansible_run import run_playbook
from tests.bench_grid import REDUCED_GRID

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}


def test_bench_playbook_records_a_schema_valid_run(servers, tmp_path: Path, figure) -> None:
    served = servers[0]  # tests/controller/conftest.py: its log is a file
    port, model, log = served.port, served.model, served.log
    (tmp_path / "tpu.env").write_text(
        f"# rendered by hand for this test\nRIG_MODEL_KEY={served.name}\nRIG_MAX_NUM_SEQS=4\n"
        'RIG_EXTRA_ARGS="--enforce-eager --kv-cache-memory-bytes 268435456"\n'
    )
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        json.dumps(
            {
                "rigs": {
                    "hosts": {
                        "controller-rig": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": "/usr/bin/python3",
                            "rig_platform": "controller",
                            "rig_model": served.name,
                            "rig_listen_address": "127.0.0.1",
                            "rig_port": port,
                        }
                    }
                }
            }
        )
    )
    runs = tmp_path / "runs"
    run = run_playbook(
        "playbooks/bench.yml",
        inventory=inventory,
        extra_vars={
            **REDUCED_GRID,
            "bench_run_id": "controller-tiny",
            "bench_env_file": str(tmp_path / "tpu.env"),
            "bench_log_file": str(log),
            "bench_model_dir": str(model),
            "bench_runs_dir": str(runs),
            "bench_fetch_root": str(tmp_path / "fetched"),
            "bench_update_index": False,
        },
        timeout=1200,
    )
    assert run.rc == 0, run.output[-6000:]
    figure("bench.yml, reduced grid on the controller", f"{run.seconds:.0f} s")
    # Progress: one line per cell as the sweep runs.
    assert "cell 1/6: input 128, concurrency 1" in run.output and "cell 6/6" in run.output

    out = runs / "controller-tiny"
    rec = json.loads((out / "run.json").read_text())
    validate(rec)
    cells = {(c["input_len"], c["concurrency"]): c for c in rec["bench"]["cells"]}
    assert len(cells) == 6  # nothing dropped
    for key in ((128, 1), (128, 2)):
        assert cells[key]["status"] == "ok" and len(cells[key]["repeats"]) == 2
        assert cells[key]["median"]["output_tok_s"] > 0
        assert all(r["output_tokens"] == 16 * cells[key]["num_prompts"] for r in cells[key]["repeats"])
    assert cells[(128, 8)]["status"] == "infeasible" and "max-num-seqs 4" in cells[(128, 8)]["reason"]
    assert all(cells[(4096, c)]["status"] == "infeasible" for c in (1, 2, 8))
    assert cells[(128, 1)]["num_prompts"] == 8 and cells[(128, 8)]["num_prompts"] == 32
    decode = rec["bench"]["decode"]
    assert decode["status"] == "ok" and len(decode["runs"]) == 3 and decode["output_tok_s"] > 0
    # From the server's real log: the engine resolved prefix caching off, and sized its KV cache.
    assert rec["bench"]["prefix_caching"] is False
    assert rec["memory"]["kv_cache_tokens"] > 0 and rec["software"]["vllm_version"] == "0.29.0"
    assert (
        rec["software"]["server_settings"]["RIG_EXTRA_ARGS"]
        == "--enforce-eager --kv-cache-memory-bytes 268435456"
    )
    assert rec["hardware"]["platform"] == "controller" and rec["hardware"]["cpu_count"] >= 1
    md = (out / "REPORT.md").read_text()
    assert "infeasible: concurrency 8 exceeds max-num-seqs 4" in md
    for png in ("throughput.png", "ttft.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    figure(
        "tiny model on this CPU, c=1 input 128",
        f"{cells[(128, 1)]['median']['output_tok_s']:.1f} output tok/s",
    )


def test_bench_playbook_check_mode_measures_nothing(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"rigs": {"hosts": {"r": LOCAL}}}))
    run = run_playbook("playbooks/bench.yml", "--check", inventory=inventory, timeout=300)
    assert run.rc == 0, run.output[-4000:]
    assert "would run 8 cells" in run.output and run.total("changed", hosts=["r"]) == 0


def test_bench_playbook_rejects_a_bad_grid(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"rigs": {"hosts": {"r": LOCAL}}}))
    run = run_playbook(
        "playbooks/bench.yml", inventory=inventory, extra_vars={"bench_concurrency": [0, 4]}, timeout=300
    )
    assert run.rc != 0 and "bench_concurrency" in run.output
