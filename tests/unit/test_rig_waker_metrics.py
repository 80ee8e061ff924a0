"""rig-waker's GET /waker/metrics and its one start per rig, in-process with a stub Compute API.

The metrics text is read back with prometheus_client's parser (what Prometheus accepts), rig names
with quotes, backslashes and newlines included. The single-flight test runs in lockstep: the stub
holds instances.start until the second start has said it joins, so no timing decides the outcome.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_spot_recovery import load_waker

HOSTILE = 'rig"} 1\ngemma_rig_waker_rig_stopped{rig="x\\'


def waker_with(module: Any, names: list[str], spot: set[str], backends: dict[str, list[str]]) -> Any:
    rigs = [
        {"name": n, "address": "127.0.0.1", "port": 9, "project": "p", "zone": "z", "instance": f"i{k}",
         "spot": n in spot}
        for k, n in enumerate(names)
    ]  # fmt: skip
    return module.Waker({"api": "http://127.0.0.1:9", "token": {"file": "/dev/null"}, "rigs": rigs,
                         "backends": backends, "poll": 0})  # fmt: skip


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_start_at_zero_for_every_rig_and_reason() -> None:
    module = load_waker()
    waker = waker_with(module, ["a", "b"], {"a"}, {"be": ["a", "b"]})
    got = samples(module.metrics(waker))
    assert got[("gemma_rig_waker_preemptions_total", (("rig", "a"),))] == 0
    assert ("gemma_rig_waker_preemptions_total", (("rig", "b"),)) not in got  # not spot: never preempted
    starts = {k for k in got if k[0] == "gemma_rig_waker_starts_total"}
    assert {dict(k[1])["reason"] for k in starts if dict(k[1])["rig"] == "a"} == {"wake", "recovery"}
    assert {dict(k[1])["reason"] for k in starts if dict(k[1])["rig"] == "b"} == {"wake"}
    assert len(starts) == 6 and all(got[k] == 0 for k in starts)
    assert got[("gemma_rig_waker_rig_stopped", (("rig", "a"),))] == 0
    assert got[("gemma_rig_waker_rig_stopped", (("rig", "b"),))] == 0


def test_a_hostile_rig_name_stays_one_label_value() -> None:
    module = load_waker()
    waker = waker_with(module, [HOSTILE], set(), {"be": [HOSTILE]})
    waker.stopped[HOSTILE] = 1
    text = module.metrics(waker)
    got = samples(text)
    assert got == {
        ("gemma_rig_waker_starts_total", (("outcome", "failed"), ("reason", "wake"), ("rig", HOSTILE))): 0,
        ("gemma_rig_waker_starts_total", (("outcome", "ok"), ("reason", "wake"), ("rig", HOSTILE))): 0,
        ("gemma_rig_waker_rig_stopped", (("rig", HOSTILE),)): 1,
    }
    assert text.count("\n") == 9  # 6 HELP/TYPE lines and 3 samples: no line the name made up
    assert module.label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


class HeldCompute:
    """The Compute API of stopped instances; instances.start of one waits until ``release`` is set."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.status: dict[str, str] = {}
        self.calls: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def call(
        self, method: str, path: str, query: dict[str, str] | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        instance = path.split("/instances/", 1)[1].split("/")[0]
        self.calls.append(f"{method} {instance}{'/start' if path.endswith('/start') else ''}")
        if method == "POST":
            self.entered.set()
            assert self.release.wait(30), "the test never released the start"
            if self.fail:
                return {"status": "DONE", "error": {"errors": [{"code": "STOCKOUT", "message": "no room"}]}}
            self.status[instance] = "RUNNING"
            return {"status": "DONE", "name": "op-1"}
        return {"status": self.status.get(instance, "TERMINATED"), "id": "1"}


@pytest.mark.parametrize("fail", [False, True], ids=["ok", "failed"])
def test_a_wake_and_a_recovery_of_one_rig_share_its_start(
    fail: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request for a backend of rigs a and b starts a; spot recovery of a, arriving meanwhile (not
    a subset job of the request's: it would have started a second time before), joins that start."""
    module = load_waker()
    waker = waker_with(module, ["a", "b"], {"a"}, {"be": ["a"], "both": ["a", "b"]})
    compute = waker.compute = HeldCompute(fail)
    waker.rigs["b"].healthy = lambda: False
    waker.rigs["a"].healthy = lambda: compute.status.get("i0") == "RUNNING"
    joined = threading.Event()
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if "joins its start already under way" in line:
            joined.set()

    monkeypatch.setattr(module, "log", log)
    outcome: dict[str, Any] = {}

    def run(what: str, work: Any) -> None:
        try:
            outcome[what] = work()
        except module.WakeError as exc:
            outcome[what] = exc

    wake = threading.Thread(target=run, args=("wake", lambda: waker.rig_for("both")))
    wake.start()
    assert compute.entered.wait(30)
    waker.recovery["a"].update(busy=True, attempts=1)
    recovery = threading.Thread(target=run, args=("recovery", lambda: waker._recover(waker.rigs["a"])))
    recovery.start()
    assert joined.wait(30)
    compute.release.set()
    wake.join(30)
    recovery.join(30)
    assert compute.calls.count("POST i0/start") == 1
    got = samples(module.metrics(waker))
    key = "failed" if fail else "ok"
    assert got[("gemma_rig_waker_starts_total", (("outcome", key), ("reason", "wake"), ("rig", "a")))] == 1
    starts_of_a = [
        v for (name, labels), v in got.items() if name.endswith("starts_total") and ("rig", "a") in labels
    ]
    assert sum(starts_of_a) == 1  # the recovery joined: no start of its own
    if fail:
        assert isinstance(outcome["wake"], module.WakeError) and "STOCKOUT" in str(outcome["wake"])
        assert "STOCKOUT" in waker.recovery["a"]["last_error"]
    else:
        assert outcome["wake"] is waker.rigs["a"] and waker.recovery["a"]["up"]


def test_promtool_finds_nothing_to_lint_in_the_metrics() -> None:
    """Prometheus's own linter (`promtool check metrics`: names, HELP, TYPE, counters' _total)."""
    from tests.unit.test_alert_rules import promtool

    module = load_waker()
    waker = waker_with(module, ["a", "b"], {"a"}, {"be": ["a", "b"]})
    result = subprocess.run(
        [promtool(), "check", "metrics"], input=module.metrics(waker), capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
