"""The alerting and recording rules (roles/monitoring/files/rules) against Prometheus's own promtool:
the files load (`promtool check rules`), their unit tests pass (`promtool test rules`,
tests/promtool), and every alert has a test case where it fires and one where it stays silent, a
severity and a summary (so an alert added without its test fails here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

PROMTOOL = ROOT / "build/prometheus/usr/bin/promtool"
RULES = sorted((ROOT / "roles/monitoring/files/rules").glob("*.rules.yml"))
TESTS = sorted((ROOT / "tests/promtool").glob("*.test.yml"))
# The alert names docs/metrics.md documents (an alert renamed or dropped is a change there too).
ALERTS = {
    "GemmaRigDown", "GemmaRigNotReady", "GemmaRigKVCacheFull", "GemmaRigRequestsWaiting",
    "GemmaGatewayErrorRate", "GemmaRigRestarted", "GemmaDiskNearlyFull", "GemmaSpotPreempted",
}  # fmt: skip
SEVERITIES = {"critical", "warning", "info"}


def promtool() -> Path:
    """promtool as scripts/setup.sh unpacks it; absent: a skip here, a failure in CI."""
    if os.access(PROMTOOL, os.X_OK):
        return PROMTOOL
    why = f"{PROMTOOL} missing: run scripts/setup.sh (it unpacks Debian's prometheus package there)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(why)
    pytest.skip(why)


def alerting_rules(paths: list[Path]) -> list[dict[str, Any]]:
    """Every alerting rule of the rule files."""
    return [
        rule
        for path in paths
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def alert_cases(paths: list[Path]) -> tuple[set[str], set[str]]:
    """The alert names the promtool tests expect to fire somewhere, and those they expect silent."""
    fired, silent = set(), set()
    for path in paths:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test") or []:
                (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    return fired, silent


def untested(rules: list[Path], tests: list[Path]) -> list[str]:
    """What each alert lacks: a case where it fires, a case where it does not."""
    fired, silent = alert_cases(tests)
    names = {rule["alert"] for rule in alerting_rules(rules)}
    return sorted(
        [f"{name}: no test case fires it" for name in names - fired]
        + [f"{name}: no test case where it stays silent" for name in names - silent]
    )


def test_the_rule_files_are_there() -> None:
    assert [p.name for p in RULES] == ["gemma-rig.rules.yml"] and TESTS


def test_promtool_check_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", *RULES], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", *TESTS],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout


def test_the_tests_cover_every_rule_file() -> None:
    named = {
        (path.parent / rule_file).resolve()
        for path in TESTS
        for rule_file in yaml.safe_load(path.read_text())["rule_files"]
    }
    assert {p.resolve() for p in RULES} <= named


def test_every_alert_fires_in_a_test_and_stays_silent_in_another() -> None:
    assert untested(RULES, TESTS) == []


def test_a_new_alert_without_a_test_is_caught(tmp_path: Path) -> None:
    """The check above over a rules file with one more alert: it names that alert (twice)."""
    rules = yaml.safe_load(RULES[0].read_text())
    rules["groups"][-1]["rules"].append(
        {"alert": "GemmaSomethingNew", "expr": "vector(1)", "labels": {"severity": "info"},
         "annotations": {"summary": "new"}}
    )  # fmt: skip
    extended = tmp_path / "extended.rules.yml"
    extended.write_text(yaml.safe_dump(rules))
    assert untested([extended], TESTS) == [
        "GemmaSomethingNew: no test case fires it",
        "GemmaSomethingNew: no test case where it stays silent",
    ]


def test_the_alerts_are_the_documented_ones() -> None:
    assert {rule["alert"] for rule in alerting_rules(RULES)} == ALERTS


@pytest.mark.parametrize("rule", alerting_rules(RULES), ids=lambda r: r["alert"])
def test_every_alert_has_a_severity_and_a_summary(rule: dict[str, Any]) -> None:
    assert rule.get("labels", {}).get("severity") in SEVERITIES
    annotations = rule.get("annotations", {})
    assert annotations.get("summary", "").strip() and annotations.get("description", "").strip()
    if rule["alert"] != "GemmaGatewayErrorRate":  # the gateway's alert is the one not about a rig
        assert "$labels.rig" in annotations["summary"]
