"""run.json schema, the report builder, plots, the imported reference runs and INDEX.md."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evidence import RUNS_DIR
from evidence.index import load_runs, render_index
from evidence.index import main as index_main
from evidence.logs import parse_log
from evidence.reference import t4_runs, tpu_runs
from evidence.report import RunInvalid, build_run, merge_bench, render_markdown, validate, write_run

FIX = Path(__file__).parent / "evidence_fixtures"
# The imported runs' source, kept in the repository (a copy of the reference rigs' tables).
FACTS = Path(__file__).resolve().parents[2] / "docs" / "measurements.md"
META = {
    "run_id": "cpu-tiny",
    "date": "2026-11-29",
    "hardware": {"platform": "controller", "accelerator": "CPU"},
    "model": {"key": "tiny-a"},
}


@pytest.fixture()
def run() -> dict:
    bench = json.loads((FIX / "cpu_tiny_bench.json").read_text())
    return build_run(META, bench, (FIX / "cpu_tiny_eager.log").read_text())


def test_built_run_is_valid_and_carries_log_facts(run: dict) -> None:
    validate(run)
    assert run["memory"]["kv_cache_tokens"] == 335_544
    assert run["memory"]["model_loading_gib"] is None  # the CPU build prints no such line
    assert run["software"]["vllm_version"] == "0.29.0"
    assert run["bench"]["prefix_caching"] is False
    statuses = [c["status"] for c in run["bench"]["cells"]]
    assert "infeasible" in statuses and "ok" in statuses


def test_every_ok_cell_median_is_the_median_of_its_repeats(run: dict) -> None:
    for cell in run["bench"]["cells"]:
        if cell["status"] != "ok":
            continue
        values = sorted(r["output_tok_s"] for r in cell["repeats"])
        mid = len(values) // 2
        median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
        assert cell["median"]["output_tok_s"] == pytest.approx(median)
        assert cell["spread"]["output_tok_s"] == {"min": values[0], "max": values[-1]}


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda r: r["memory"].update(kv_cache_tokens=-1), "memory/kv_cache_tokens"),
        (lambda r: r["bench"]["cells"][0].update(median=None), "bench"),
        (lambda r: r["bench"]["cells"][2].update(reason=None), "bench"),
        (lambda r: r["bench"]["cells"][0].update(status="skipped"), "bench"),
        (lambda r: r["hardware"].update(platform="laptop"), "hardware/platform"),
        (lambda r: r.update(extra=1), "(top level)"),
        (lambda r: r["provenance"].update(kind="guessed"), "provenance/kind"),
        (lambda r: r.pop("memory"), "(top level)"),
    ],
)
def test_schema_rejects_bad_runs(run: dict, mutate, where: str) -> None:
    bad = copy.deepcopy(run)
    mutate(bad)
    with pytest.raises(RunInvalid, match=re.escape(where)):
        validate(bad)


def test_null_is_allowed_where_zero_would_lie(run: dict) -> None:
    run["memory"]["kv_cache_memory_gib"] = None
    run["startup"]["engine_init_s"] = None
    validate(run)


def test_write_run_makes_report_and_pngs(run: dict, tmp_path: Path) -> None:
    out = write_run(run, tmp_path / "cpu-tiny")
    assert json.loads((out / "run.json").read_text()) == run
    md = (out / "REPORT.md").read_text()
    assert "infeasible: concurrency 8 exceeds max-num-seqs 4" in md
    assert "335,544" in md and "(throughput.png)" in md
    for name in ("throughput.png", "ttft.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_write_run_refuses_invalid_and_writes_nothing(run: dict, tmp_path: Path) -> None:
    run["bench"]["cells"][0]["status"] = "maybe"
    with pytest.raises(RunInvalid):
        write_run(run, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_report_cli_build_and_errors(repo_root: Path, tmp_path: Path) -> None:
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(META))
    cmd = [
        sys.executable,
        "-m",
        "evidence.report",
        "build",
        "--meta",
        str(meta),
        "--out",
        str(tmp_path / "r"),
    ]
    ok = subprocess.run(
        [*cmd, "--bench", str(FIX / "cpu_tiny_bench.json"), "--journal", str(FIX / "cpu_tiny_eager.log")],
        cwd=repo_root, capture_output=True, text=True,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    validate(json.loads((tmp_path / "r" / "run.json").read_text()))
    meta.write_text(json.dumps({"run_id": "x"}))
    bad = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True)
    assert bad.returncode != 0 and "lacks 'date'" in bad.stderr


def test_report_cli_writes_evidence_runs_without_out(monkeypatch, tmp_path: Path, capsys) -> None:
    """bench.yml's default (bench_runs_dir empty): the run lands in evidence/runs/<run_id>."""
    from evidence import report

    monkeypatch.setattr(report, "RUNS_DIR", tmp_path / "runs")
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(META))
    assert report.main(["build", "--meta", str(meta), "--bench", str(FIX / "cpu_tiny_bench.json")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "runs" / "cpu-tiny")
    validate(json.loads((tmp_path / "runs" / "cpu-tiny" / "run.json").read_text()))


def test_imported_runs_are_committed_as_generated() -> None:
    for run in t4_runs() + tpu_runs():
        validate(run)
        committed = json.loads((RUNS_DIR / run["run_id"] / "run.json").read_text())
        assert committed == json.loads(json.dumps(run)), run["run_id"]
        assert committed["provenance"]["kind"] == "imported"
        assert render_markdown(committed) == (RUNS_DIR / run["run_id"] / "REPORT.md").read_text()


def _num(text: str) -> float:
    return float(text.replace(",", "").split()[0])


def test_imported_t4_rows_match_facts_table() -> None:
    # Each T4 table row in docs/measurements.md: | build | loading GiB | KV tokens | decode |
    rows = re.findall(r"^\| [^|]+ \| ([\d.]+) GiB \| ([\d,]+) \| ([^|]+)\|$", FACTS.read_text(), re.M)
    facts = {(_num(g), int(t.replace(",", ""))): d.strip() for g, t, d in rows}
    assert len(facts) == 5
    for run in t4_runs():
        key = (run["memory"]["model_loading_gib"], run["memory"]["kv_cache_tokens"])
        assert key in facts, run["run_id"]
        bench = run["bench"]
        if facts[key] == "—":
            assert bench is None
        else:
            got = (
                bench["decode"]["output_tok_s"]
                if bench["decode"]
                else bench["cells"][0]["median"]["output_tok_s"]
            )
            assert got == _num(facts[key])


def test_imported_tpu_card_matches_facts() -> None:
    """Every row of the W8A8 card's table (docs/measurements.md) and both paired comparisons."""
    text = FACTS.read_text()
    rows = re.findall(r"^\| ([^|]+) \| ([^|]+) \| ([\d.]+) ms \| ([\d.]+)% \|$", text, re.M)
    assert len(rows) == len(tpu_runs()) == 4
    for run, (_, sweep, ttft, score) in zip(tpu_runs(), rows, strict=True):
        tok = [c["median"]["output_tok_s"] for c in run["bench"]["cells"]]
        if sweep.strip() == "not given":
            assert tok == [None], run["run_id"]
        else:
            assert " / ".join(f"{int(t):,}" for t in tok) == sweep.strip(), run["run_id"]
        assert run["bench"]["cells"][0]["median"]["ttft_ms"] == float(ttft)
        assert f"Suite accuracy {score}%" in run["provenance"]["notes"]
    qat = tpu_runs()[-1]["accuracy"]
    assert [a["a"] for a in qat] == ["bf16", "w8a8 (rounded from bf16)"]
    for acc in qat:
        assert f"+{acc['diff']}, 95% range {acc['ci_low']:+} to +{acc['ci_high']}" in " ".join(text.split())
        assert (acc["n_boot"], acc["seed"], acc["records"]) == (2000, 0, 3880)


def test_index_is_current_and_lists_every_run(repo_root: Path) -> None:
    assert index_main(["--check"]) == 0
    text = (repo_root / "evidence" / "INDEX.md").read_text()
    for path in RUNS_DIR.glob("*/run.json"):
        assert f"(runs/{path.parent.name}/REPORT.md)" in text


def test_index_detects_stale_and_invalid(tmp_path: Path, run: dict) -> None:
    write_run(run, tmp_path / "runs" / "cpu-tiny")
    assert index_main(["--evidence-dir", str(tmp_path), "--check"]) == 1
    assert index_main(["--evidence-dir", str(tmp_path)]) == 0
    assert index_main(["--evidence-dir", str(tmp_path), "--check"]) == 0
    assert "cpu-tiny" in render_index(load_runs(tmp_path / "runs"), tmp_path)
    (tmp_path / "runs" / "cpu-tiny" / "run.json").write_text(json.dumps({**run, "run_id": "other"}))
    with pytest.raises(RunInvalid, match="differs from its folder"):
        load_runs(tmp_path / "runs")


def test_merge_bench_keeps_cells_in_order_and_the_decode() -> None:
    whole = json.loads((FIX / "cpu_tiny_bench.json").read_text())
    parts = [{**whole, "cells": [c], "decode": None} for c in whole["cells"]]
    parts.append({**whole, "cells": [], "decode": whole["decode"]})
    merged = merge_bench(parts)
    assert merged["cells"] == whole["cells"] and merged["decode"] == whole["decode"]
    assert merge_bench([]) is None


def test_imported_emb4_startup_matches_the_logged_lines() -> None:
    # The log block in docs/measurements.md, read by the same parser the rigs' journals go through.
    block = re.search(r"## The emb4 build's start-up.*?```\n(.*?)```", FACTS.read_text(), re.S)
    assert block, "docs/measurements.md lost its emb4 log block"
    logged = parse_log(block[1])
    emb4 = next(run for run in t4_runs() if run["model"]["key"] == "emb4")
    for section in ("memory", "startup"):
        for key, value in emb4[section].items():
            if value is not None and key in logged and logged[key] is not None:
                assert value == logged[key], (section, key)
    assert logged["kv_cache_tokens"] == emb4["memory"]["kv_cache_tokens"] == 1_099_362
    assert logged["model_loading_s"] == emb4["startup"]["model_loading_s"] == 88.98
    assert logged["linear_kernel"] == emb4["startup"]["linear_kernel"]
