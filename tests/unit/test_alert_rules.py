"""The alerting and recording rules (roles/monitoring/files/rules) against Prometheus's own promtool:
the files load (`promtool check rules`), their unit tests pass (`promtool test rules`,
tests/promtool), and every alert has a test case where it fires and one where it stays silent, a
severity and a summary (so an alert added without its test fails here). The figure an alert's text
states ("more than 90%") is the threshold in its expression (so neither changes alone)."""

from __future__ import annotations

import os
import re
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
# Where an alert's annotations state its threshold, and where its expr has it: per alert, a pattern
# for the words and the percentage in the text, and one for the comparison and the fraction in the
# expr (every match of it; GemmaDiskNearlyFull compares twice, the host's and the rigs' filesystems).
# GemmaGatewayErrorRate's traffic floor (">= 10") and the "> 0" of the others are stated nowhere.
STATED = {
    "GemmaRigKVCacheFull": (
        r"(more than) (\d+(?:\.\d+)?)% of its KV cache",
        r"vllm:kv_cache_usage_perc\{[^}]*\}\s*(>=|<=|>|<)\s*([0-9.]+)",
    ),
    "GemmaGatewayErrorRate": (
        r"(More than) (\d+(?:\.\d+)?)% of the answers",
        r"\)\s*(>=|<=|>|<)\s*([0-9.]+)\s+and on \(instance\)",
    ),
    "GemmaDiskNearlyFull": (
        r"(less than) (\d+(?:\.\d+)?)% free",
        r"(?:\)|gemma_rig_filesystem_size_bytes\{[^}]*\})\s*(>=|<=|>|<)\s*([0-9.]+)",
    ),
}
STATED_COMPARISONS = {"GemmaDiskNearlyFull": 2}  # the others: one
# The comparison the words mean.
WORDS = {"more than": ">", "less than": "<", "at least": ">=", "at most": "<="}


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


def threshold_mismatches(rule: dict[str, Any]) -> list[str]:
    """Where the figure the alert's text states (STATED) is not the threshold its expr has."""
    name = rule["alert"]
    text = " ".join(rule.get("annotations", {}).values())
    if name not in STATED:
        if re.search(r"\d%", text):
            return [f"{name}: its text states a percentage that STATED does not name"]
        return []
    words_pattern, expr_pattern = STATED[name]
    stated = re.findall(words_pattern, text)
    compared = re.findall(expr_pattern, rule["expr"])
    if len(stated) != 1:
        return [f"{name}: {len(stated)} matches of {words_pattern!r} in its annotations, not one"]
    if len(compared) != STATED_COMPARISONS.get(name, 1):
        return [f"{name}: {len(compared)} matches of {expr_pattern!r} in its expr"]
    words, percent = stated[0]
    return [
        f"{name}: the text says {words} {percent}%, the expr {op} {fraction}"
        for op, fraction in compared
        if op != WORDS[words.lower()] or round(float(percent) / 100, 9) != round(float(fraction), 9)
    ]


@pytest.mark.parametrize("rule", alerting_rules(RULES), ids=lambda r: r["alert"])
def test_the_text_states_the_threshold_of_the_expr(rule: dict[str, Any]) -> None:
    assert threshold_mismatches(rule) == []


def test_stated_names_alerts_there_are() -> None:
    assert set(STATED) <= ALERTS


def _changed(text: str, pattern: str, nth: int, group: int, change: dict[str, str] | float) -> str:
    """``text`` with group ``group`` of the ``nth`` match of ``pattern`` changed: mapped through
    ``change``, or (a number) raised by ``change``."""
    match = list(re.finditer(pattern, text))[nth]
    old = match.group(group)
    new = change[old] if isinstance(change, dict) else f"{float(old) + change:g}"
    return text[: match.start(group)] + new + text[match.end(group) :]


# A comparison made inclusive, or strict.
FLIPPED = {">": ">=", "<": "<=", ">=": ">", "<=": "<"}
# Per alert of STATED, one side changed alone: its expr's threshold (each comparison) moved a step,
# its comparison flipped, or the figure in its text moved a percent.
CHANGES = [
    *[
        (alert, f"expr-{what}-{nth}", "expr", nth, group, change)
        for alert in STATED
        for nth in range(STATED_COMPARISONS.get(alert, 1))
        for what, group, change in (("threshold", 2, 0.01), ("comparison", 1, FLIPPED))
    ],
    *[(alert, "text-figure", "text", 0, 2, 1) for alert in STATED],
]


@pytest.mark.parametrize(
    ("alert", "where", "nth", "group", "change"),
    [(alert, where, nth, group, change) for alert, _, where, nth, group, change in CHANGES],
    ids=[f"{alert}-{what}" for alert, what, *_ in CHANGES],
)
def test_a_threshold_changed_alone_is_caught(
    alert: str, where: str, nth: int, group: int, change: dict[str, str] | float
) -> None:
    """The check above over a rule with one side changed: it reports the alert."""
    (rule,) = [r for r in alerting_rules(RULES) if r["alert"] == alert]
    words_pattern, expr_pattern = STATED[alert]
    if where == "expr":
        changed = {**rule, "expr": _changed(rule["expr"], expr_pattern, nth, group, change)}
    else:
        annotations = {
            key: _changed(value, words_pattern, nth, group, change)
            if re.search(words_pattern, value)
            else value
            for key, value in rule["annotations"].items()
        }
        changed = {**rule, "annotations": annotations}
    assert changed != rule  # the change applied
    mismatches = threshold_mismatches(changed)
    assert mismatches and all(m.startswith(f"{alert}: ") for m in mismatches)


def test_a_percentage_in_an_unnamed_alert_is_caught() -> None:
    """An alert STATED does not name, whose text states a percentage: reported."""
    rule = {"alert": "GemmaSomethingNew", "expr": "vector(1) > 0.5", "annotations": {"summary": "over 50%"}}
    assert threshold_mismatches(rule) == [
        "GemmaSomethingNew: its text states a percentage that STATED does not name"
    ]


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
