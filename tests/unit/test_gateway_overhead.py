"""measure/gateway_overhead.py: its rounds, sums and command line, against two fake rigs.

The figure itself comes from the local fleet (tests/e2e/test_25_gateway.py runs it through the real
gateway) and is printed there, never asserted on. Here one fake rig stands for the rig asked
directly and another for the gateway (tests/fake_rig.py: each answer reports one token).
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

import gateway_overhead as bg  # noqa: E402

SCRIPT = ROOT / "measure" / "gateway_overhead.py"


def test_rounds_alternate_and_the_key_goes_to_the_gateway_only() -> None:
    with FakeRig("m") as direct, FakeRig("m") as gateway:
        result = bg.measure(
            f"http://127.0.0.1:{direct.port}", f"http://127.0.0.1:{gateway.port}", "m",
            key="sk-gw", concurrency=3, requests=5, rounds=3, max_tokens=4,
        )  # fmt: skip
    assert [r.endpoint for r in result.rounds] == [
        "direct",
        "gateway",
        "gateway",
        "direct",
        "direct",
        "gateway",
    ]
    assert all(r.tokens == 5 and r.seconds > 0 for r in result.rounds)  # one token per fake answer
    for rig in (direct, gateway):
        assert len(rig.log) == 3 + 3 * 5  # a warm-up round of `concurrency` requests, then 3 rounds
        assert {entry["model"] for entry in rig.log} == {"m"}
    assert {entry["authorization"] for entry in gateway.log} == {"Bearer sk-gw"}
    assert {entry["authorization"] for entry in direct.log} == {None}
    tokens, seconds = result.total("gateway")
    assert tokens == 15 and result.tokens_per_s("gateway") == pytest.approx(15 / seconds)
    assert result.ratio == pytest.approx(result.tokens_per_s("gateway") / result.tokens_per_s("direct"))
    assert "c=3" in result.summary() and "ratio" in result.summary()
    # Each round's ratio pairs the round's two shares, whichever went first.
    rounds = result.rounds
    assert result.round_ratios() == [
        pytest.approx(rounds[1].tokens_per_s / rounds[0].tokens_per_s),
        pytest.approx(rounds[2].tokens_per_s / rounds[3].tokens_per_s),
        pytest.approx(rounds[5].tokens_per_s / rounds[4].tokens_per_s),
    ]
    assert f"min {min(result.round_ratios()):.3f}" in result.summary()


def test_round_ratios_from_known_rounds() -> None:
    result = bg.Result(8, 4, 2)
    result.rounds = [
        bg.Round("direct", 1.0, 100),
        bg.Round("gateway", 2.0, 100),  # half the direct round's throughput
        bg.Round("gateway", 1.0, 100),
        bg.Round("direct", 1.25, 100),  # 1.25 times the direct round's throughput
    ]
    assert result.round_ratios() == [pytest.approx(0.5), pytest.approx(1.25)]
    assert result.ratio == pytest.approx((200 / 3.0) / (200 / 2.25))
    assert "per round: median 0.875, min 0.500, max 1.250" in result.summary()


def test_a_failing_endpoint_stops_the_bench_naming_it() -> None:
    with (
        FakeRig("m") as direct,
        FakeRig("other") as gateway,
        pytest.raises(bg.BenchError, match=rf"127.0.0.1:{gateway.port}.* answered 404"),
    ):
        bg.measure(f"http://127.0.0.1:{direct.port}", f"http://127.0.0.1:{gateway.port}", "m", requests=2)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_help_and_one_line_errors(tmp_path: Path) -> None:
    shown = run("--help")
    assert shown.returncode == 0 and "--concurrency" in shown.stdout and "--key-file" in shown.stdout
    base = ("--rig", "http://127.0.0.1:1", "--gateway", "https://127.0.0.1:2", "--model", "m")
    bad = run(*base, "--concurrency", "0")
    assert bad.returncode == 2 and bad.stderr.strip().endswith("--concurrency must be at least 1")
    missing = run(*base, "--key-file", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr.splitlines()[-1]
    refused = run(*base)  # nothing listens on port 1
    assert (
        refused.returncode == 1
        and refused.stderr.startswith("gateway_overhead: ")
        and len(refused.stderr.splitlines()) == 1
    )


def test_record(tmp_path: Path) -> None:
    with FakeRig("m") as direct, FakeRig("m") as gateway:
        key = tmp_path / "key"
        key.write_text("sk-gw\n")
        done = run(
            "--rig", f"http://127.0.0.1:{direct.port}", "--gateway", f"http://127.0.0.1:{gateway.port}",
            "--model", "m", "--key-file", str(key), "--requests", "2", "--rounds", "2", "--concurrency", "2",
            "--record", str(tmp_path / "out"), "--label", "t",
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "out" / "t.json").read_text())
    assert record["ratio"] == pytest.approx(record["gateway_tokens_per_s"] / record["direct_tokens_per_s"])
    assert [r["endpoint"] for r in record["rounds"]] == ["direct", "gateway", "gateway", "direct"]
    assert len(record["round_ratios"]) == 2
    assert "sk-gw" not in (tmp_path / "out" / "t.json").read_text() + done.stdout
