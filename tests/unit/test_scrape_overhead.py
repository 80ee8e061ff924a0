"""measure/scrape_overhead.py: its arms, scrapes, CPU figure and command line, against a fake rig.

The figures themselves come from the local rig (docs/metrics.md) and are printed, never asserted on.
tests/fake_rig.py answers each chat with one token and serves process_cpu_seconds_total.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_rig import FakeRig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "measure"))

import scrape_overhead as so  # noqa: E402

SCRIPT = ROOT / "measure" / "scrape_overhead.py"


def test_arms_alternate_and_only_the_scraped_arm_is_scraped() -> None:
    with FakeRig("m") as rig:
        result = so.measure(
            f"http://127.0.0.1:{rig.port}", "m", rig_key="sk-rig", interval=0.05, concurrency=2,
            requests=3, rounds=3, max_tokens=4, scrapes=5,
        )  # fmt: skip
        log = list(rig.log)
    assert [r.endpoint for r in result.rounds] == ["quiet", "scraped", "scraped", "quiet", "quiet", "scraped"]
    assert all(r.tokens == 3 for r in result.rounds)  # the fake reports one token per answer
    scrapes = [e for e in log if e["path"] == "/metrics"]
    # One scrape starts each scraped arm at least; the CPU figure's own 6 come before any load.
    assert len(scrapes) == 6 + result.scrapes_during_load
    assert result.scrapes_during_load >= 3
    assert {e["authorization"] for e in log} == {"Bearer sk-rig"}
    assert result.cpu_per_scrape_s >= 0
    assert len(result.round_ratios()) == 3


def test_cpu_seconds_reads_the_process_counter_and_refuses_a_page_without_it() -> None:
    text = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\nvllm:x 1\n"
    assert so.cpu_seconds(text) == 12.5
    with pytest.raises(so.BenchError, match="no process_cpu_seconds_total"):
        so.cpu_seconds("process_cpu_seconds_total_created 1\n")


def test_the_core_share_is_the_scrape_cost_over_the_interval() -> None:
    result = so.Result(concurrency=1, requests=1, max_tokens=1, interval=15, cpu_per_scrape_s=0.003)
    assert result.core_share == pytest.approx(0.0002)


def test_the_command_line_records_and_refuses_bad_numbers(tmp_path: Path) -> None:
    with FakeRig("m") as rig:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--rig", f"http://127.0.0.1:{rig.port}", "--model", "m",
             "--interval", "0.05", "--rounds", "2", "--requests", "2", "--concurrency", "2",
             "--scrapes", "3", "--record", str(tmp_path), "--label", "t"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ratio" in done.stdout and "of one core" in done.stdout
    record = json.loads((tmp_path / "t.json").read_text())
    assert len(record["rounds"]) == 4 and record["ratio"] > 0
    for bad in (["--rounds", "0"], ["--interval", "0"], ["--interval", "nan"]):
        refused = subprocess.run(
            [sys.executable, str(SCRIPT), "--rig", "http://127.0.0.1:9", "--model", "m", *bad],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 2 and "must be" in refused.stderr.splitlines()[-1]


def test_a_rig_that_refuses_the_scrape_is_one_line(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-wrong\n")
    with FakeRig("m") as rig:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--rig", f"http://127.0.0.1:{rig.port}/nowhere", "--model", "m",
             "--rig-key-file", str(key), "--scrapes", "1", "--rounds", "1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().startswith("scrape_overhead:") and len(done.stderr.strip().splitlines()) == 1
