"""measure/lifecycle_times.py: its pure parts (arguments, recap, downtime, medians, ratios, table).

The figures themselves come from a run on a rig (evidence/lifecycle), never from a timed test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "measure"))

import lifecycle_times as bl  # noqa: E402


def test_defaults_name_a_rig_of_its_own() -> None:
    args = bl.parse_args([])
    assert (args.container, args.host, args.port) == ("gemma-rig-speed", "rig-speed", 8020)
    assert (args.runs, args.cold_runs, args.model, args.swap_to) == (3, 1, "tiny-emb4", "tiny-w8a8")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--runs", "0"], "--runs must be at least 1, got 0"),
        (["--cold-runs", "-1"], "--cold-runs must be at least 0, got -1"),
        (["--cold-runs", "0"], "--cold-runs 0 needs --skip-cold"),
        (["--port", "70000"], "--port must be 1..65535, got 70000"),
        (["--container", "gemma-rig"], "--container gemma-rig is an e2e rig"),
        (["--container", "gemma-rig-b"], "--container gemma-rig-b is an e2e rig"),
        (["--poll", "0"], "--poll must be > 0 s"),
        (["--swap-to", "tiny-emb4"], "--swap-to must differ from --model (tiny-emb4)"),
        (["--label", "a b"], "--label 'a b' is not a plain name"),
        (["--steps", "restart,reboot"], "--steps: unknown reboot; valid: converged,check,restart"),
        (["--steps", ","], "--steps: unknown (none given)"),
    ],
)
def test_bad_arguments_fail_with_one_line_naming_them(argv, says, capsys) -> None:
    with pytest.raises(SystemExit) as err:
        bl.parse_args(argv)
    assert err.value.code == 2
    assert says in capsys.readouterr().err


def test_skip_cold_measures_no_cold_run() -> None:
    assert bl.parse_args(["--skip-cold"]).cold_runs == 0


def test_steps_default_to_all_and_can_be_chosen() -> None:
    assert bl.parse_args([]).steps == list(bl.STEPS)
    assert bl.parse_args(["--steps", "restart,swap"]).steps == ["restart", "swap"]


def test_help_says_what_it_measures() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "measure" / "lifecycle_times.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for word in ("--runs", "--record", "swap", "restart", "downtime", "gemma-rig-speed"):
        assert word in out


def test_recap_is_read_per_host() -> None:
    out = (
        "TASK [x]\nok: [rig-speed]\n\nPLAY RECAP *****\n"
        "localhost                  : ok=3    changed=0    unreachable=0    failed=0\n"
        "rig-speed                  : ok=90   changed=2    unreachable=0    failed=0    skipped=12\n"
    )
    recap = bl.parse_recap(out)
    assert recap["rig-speed"]["changed"] == 2 and recap["rig-speed"]["skipped"] == 12
    assert recap["localhost"]["ok"] == 3
    assert bl.parse_recap("no recap here") == {}


def test_downtime_runs_from_the_first_failed_poll_to_the_answer() -> None:
    samples = [(10.0, True), (10.2, True), (10.4, False), (10.6, False), (12.0, True)]
    assert bl.downtime(samples, answered=12.5) == pytest.approx(2.1)
    assert bl.downtime([(1.0, True), (2.0, True)], answered=3.0) is None  # never seen down
    assert bl.downtime(samples, answered=None) is None  # never answered again
    assert bl.downtime(samples, answered=10.0) is None  # an answer before the outage is not one


def test_medians_and_the_target_ratios() -> None:
    med = bl.summarize(
        {
            "cold_s": [300.0],
            "converged_s": [30.0, 20.0, 25.0],
            "restart_downtime_s": [10.0, 12.0, 11.0],
            "swap_downtime_s": [14.0, 16.0, 13.0, 15.0],
            "swap_back_downtime_s": [13.0, 15.0],
        }
    )
    assert med["converged_s"] == 25.0 and med["restart_downtime_s"] == 11.0 and med["swap_downtime_s"] == 14.5
    assert med["swap_over_restart_downtime"] == pytest.approx(14.5 / 11.0)
    assert med["swap_minus_restart_downtime_s"] == pytest.approx(3.5)
    assert med["swap_back_minus_restart_downtime_s"] == pytest.approx(3.0)
    assert med["converged_over_cold"] == pytest.approx(25.0 / 300.0)
    # a step that was not measured gives no ratio rather than a wrong one
    partial = bl.summarize({"converged_s": [20.0]})
    assert partial["converged_over_cold"] is None and partial["swap_over_restart_downtime"] is None
    assert partial["swap_back_minus_restart_downtime_s"] is None
    assert bl.ratio(1.0, 0.0) is None


def test_table_shows_every_median_and_dashes_for_the_missing() -> None:
    text = bl.table(
        bl.summarize({"converged_s": [24.04], "converged_changed": [0], "cold_s": [240.0]}), "after"
    )
    lines = text.splitlines()
    assert lines[0] == "| step (after) | median |"
    assert "| converged site.yml | 24.0 s |" in lines
    assert "| converged changed | 0 |" in lines
    assert "| converged / cold | 0.10x |" in lines
    assert "| swap downtime | - |" in lines


def test_unit_phases_from_systemd_timestamps() -> None:
    phases = bl.unit_phases(
        {"ActiveExitTimestamp": 100.0, "InactiveEnterTimestamp": 101.5, "ExecMainStartTimestamp": 102.0}
    )
    assert phases == {"stopping_s": 1.5, "start_pre_s": 0.5}
    assert bl.unit_phases({}) == {}
