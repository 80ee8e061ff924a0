"""Spot recovery in rig-waker, against the fake Compute API over real HTTP (no HAProxy here).

The two rigs of tests/unit/test_rig_waker.py are spot rigs and the waker looks at them every
WATCH seconds. The fake plays what Compute Engine and a guest do on their own through its control
route (a preemption, a guest's poweroff) and records the zone operations the API records; the
waker reads them with zoneOperations.list and starts again only what a preemption stopped.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_compute import Faults
from tests.unit.test_rig_waker import MINIMAL, PROJECT, TOKEN, WAKER, ZONES, Stack, chat, load_program

WATCH = 0.2
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def load_waker() -> Any:
    """rig-waker as a module (the file has no .py: the gateway host runs it as a program)."""
    return load_program(WAKER, "rig_waker")


class SpotStack(Stack):
    """The waker's configuration with both rigs spot and a short watch."""

    def config(self) -> dict:
        config = super().config()
        for rig in config["rigs"]:
            rig["spot"] = True
        config["watch"] = WATCH
        return config

    def status(self) -> dict[str, Any]:
        answer = httpx.get(self.url + "/waker/status", timeout=5)
        assert answer.status_code == 200, answer.text
        return answer.json()["rigs"]

    def event(self, name: str, what: str) -> httpx.Response:
        """The fake's control route: Compute Engine preempts the VM, or its guest powers it off."""
        return httpx.post(f"{self.fake.endpoint}/fake-admin/zones/{ZONES[name]}/instances/{name}/{what}")

    def power_on(self, name: str) -> None:
        """Start the instance as a user would (not through the waker)."""
        with self.fake.api.lock:
            self.fake.api.instance_action(PROJECT, ZONES[name], name, "start", {})
        wait(lambda: self.fake.api.get_instance(ZONES[name], name)["status"] == "RUNNING", f"{name} RUNNING")
        wait(lambda: self.rigs[name].healthy, f"{name} booted")  # its boot timer has fired

    def more_looks(self, *names: str, looks: int = 3) -> None:
        """Wait until the watch has looked at each rig ``looks`` more times (its instances.get in
        the fake's log): what it did not do by then, it did not do on those looks."""
        for name in names:
            seen = len(self.fake.api.requests("GET", f"/instances/{name}"))
            wait(
                lambda n=name, s=seen: len(self.fake.api.requests("GET", f"/instances/{n}")) >= s + looks,
                f"{looks} more looks at {name}",
            )

    def operations(self, name: str, filter_: str | None = None, **extra: str) -> httpx.Response:
        params = {"filter": filter_, **extra} if filter_ is not None else extra
        url = f"{self.fake.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONES[name]}/operations"
        return httpx.get(url, params=params, headers=AUTH)


def wait(condition: Any, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def spot(tmp_path: Path) -> Iterator[SpotStack]:
    with SpotStack(tmp_path, Faults(op_delay=0.1)) as s:
        yield s


def test_a_preempted_spot_rig_is_started_again(spot: SpotStack) -> None:
    assert chat(spot.sdk()) and spot.starts() == ["rig-a"]  # a request woke it
    assert spot.status()["rig-a"]["summary"] == "spot, no preemption seen"
    preempted = spot.event("rig-a", "preempt")
    assert preempted.status_code == 200 and preempted.json()["status"] == "TERMINATED"
    wait(lambda: spot.starts() == ["rig-a", "rig-a"], "rig-a started again")
    wait(lambda: spot.status()["rig-a"]["up"], "rig-a up again")
    rec = spot.status()["rig-a"]
    assert rec["attempts"] == 1 and rec["last_error"] == ""
    assert rec["summary"].startswith(f"preempted at {rec['preempted_at']}, started again at ")
    assert spot.rigs["rig-a"].healthy
    spot.more_looks("rig-a", "rig-b")  # once up, a look starts nothing more
    assert spot.starts() == ["rig-a", "rig-a"] and spot.status()["rig-b"]["preempted_at"] == ""
    assert spot.fake.api.mismatches == []


def test_a_rig_its_guest_or_a_user_stopped_waits_for_a_request(spot: SpotStack) -> None:
    spot.power_on("rig-a")
    spot.power_on("rig-b")
    assert spot.event("rig-a", "guestTerminate").status_code == 200  # idle stop's poweroff
    with spot.fake.api.lock:
        spot.fake.api.instance_action(PROJECT, ZONES["rig-b"], "rig-b", "stop", {})
    wait(
        lambda: spot.fake.api.get_instance(ZONES["rig-b"], "rig-b")["status"] == "TERMINATED", "rig-b stopped"
    )
    spot.more_looks("rig-a", "rig-b")
    assert spot.starts() == []
    assert {r["summary"] for r in spot.status().values()} == {"spot, no preemption seen"}
    kinds = {op["operationType"] for op in spot.operations("rig-a").json()["items"]}
    assert kinds == {"start", "compute.instances.guestTerminate"}
    assert "rig-a is TERMINATED, stopped by its guest" in spot.log
    assert "rig-b is TERMINATED, stopped through the API" in spot.log


def test_a_guest_poweroff_behind_the_apis_back_is_a_guest_terminate(spot: SpotStack) -> None:
    spot.power_on("rig-a")
    spot.fake.api.backings[(ZONES["rig-a"], "rig-a")].stop()  # what idle stop's poweroff does
    wait(lambda: "rig-a is TERMINATED, stopped by its guest" in spot.log, "the waker's decision")
    assert spot.starts() == []


def test_a_stockout_is_tried_again_later_and_the_state_says_why(tmp_path: Path) -> None:
    with SpotStack(tmp_path, Faults(op_delay=0.1)) as spot:
        spot.power_on("rig-a")
        spot.fake.api.faults.stockout_zones.add(ZONES["rig-a"])
        spot.event("rig-a", "preempt")
        wait(lambda: spot.status()["rig-a"]["attempts"] >= 2, "a second attempt")
        rec = spot.status()["rig-a"]
        assert rec["last_error"].startswith(f"stockout in {ZONES['rig-a']}: ")
        assert "ZONE_RESOURCE_POOL_EXHAUSTED" in rec["last_error"]
        assert "; recovering: stockout in us-central1-a" in rec["summary"] and "next try in" in rec["summary"]
        spot.fake.api.faults.stockout_zones.clear()  # the waits between tries: the next test
        wait(lambda: spot.status()["rig-a"]["up"], "rig-a up once the zone has room", timeout=30)
        assert spot.status()["rig-a"]["last_error"] == ""


def test_zone_operations_list_takes_only_the_filter_it_knows(spot: SpotStack) -> None:
    spot.power_on("rig-a")
    ident = spot.fake.api.get_instance(ZONES["rig-a"], "rig-a")["id"]
    answer = spot.operations("rig-a", f'targetId = "{ident}"')
    assert answer.status_code == 200
    assert [op["operationType"] for op in answer.json()["items"]] == ["start"]
    assert answer.json()["items"][0]["targetId"] == ident  # the instance's own id, as the API has it
    for bad in ['targetId != "1"', 'name = "x"', f'targetId = "{ident}" OR name = "x"', f"targetId = {ident}",
                'targetId = "1"/../x', 'targetId = "1"\n']:  # fmt: skip
        refused = spot.operations("rig-a", bad)
        assert refused.status_code == 400, bad
        error = refused.json()["error"]
        assert (
            error["message"].startswith("Invalid value for field 'filter'") and error["errors"][0]["reason"]
        )
    assert spot.operations("rig-a", maxResults="1").status_code == 400  # not silently ignored
    assert spot.operations("rig-a", "").status_code == 200  # an empty filter is none, as in the API
    assert spot.fake.api.mismatches == []


def test_the_minimal_token_lists_operations_and_no_more(spot: SpotStack) -> None:
    assert "compute.zoneOperations.list" in MINIMAL
    assert spot.operations("rig-a").status_code == 200
    url = f"{spot.fake.endpoint}/compute/v1/projects/{PROJECT}/global/operations/x"
    assert httpx.get(url, headers=AUTH).status_code == 403  # globalOperations.get: not needed


def test_the_fake_control_route_refuses_what_it_does_not_know(spot: SpotStack) -> None:
    base = f"{spot.fake.endpoint}/fake-admin/zones/{ZONES['rig-a']}/instances"
    for path in ("/rig-a/delete", "/../rig-a/preempt", "/RIG-A/preempt", "/rig-a/preempt/x"):
        assert httpx.post(base + path).status_code == 404, path
    assert httpx.get(base + "/rig-a/preempt").status_code == 404
    assert spot.event("rig-a", "preempt").status_code == 400  # TERMINATED: nothing to preempt
    assert spot.fake.api.operations == {}


def test_the_status_is_for_local_clients_that_did_not_come_through_haproxy(spot: SpotStack) -> None:
    waker = load_waker()
    for host in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"):
        assert waker.loopback(host), host
    for host in ("10.0.0.1", "::ffff:10.0.0.1", "0.0.0.0", "", "localhost", "127.0.0.1/8", "garbage%lo"):
        assert not waker.loopback(host), host
    relayed = httpx.get(spot.url + "/waker/status", headers={"X-Gemma-Rig-Backend": "be_default"})
    assert relayed.status_code == 403 and spot.starts() == []
    assert httpx.post(spot.url + "/waker/status", json={}).status_code == 400  # not the status: a request
    assert set(spot.status()) == {"rig-a", "rig-b"}


class StubCompute:
    """Answers the waker's calls from a table (an exception there is raised); records what it was asked."""

    def __init__(self, answers: dict[str, dict[str, Any] | Exception]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def call(
        self, method: str, path: str, query: dict[str, str] | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        self.calls.append(f"{method} {path} {json.dumps(query) if query else ''}".strip())
        answer = self.answers[method + " " + path.rsplit("/", 1)[-1]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def stub_waker(module: Any, answers: dict[str, dict[str, Any] | Exception]) -> tuple[Any, StubCompute]:
    rig = {"name": "r", "address": "127.0.0.1", "port": 9, "project": "p", "zone": "z", "instance": "r",
           "spot": True}  # fmt: skip
    waker = module.Waker(
        {"api": "http://127.0.0.1:9", "token": {"file": "/dev/null"}, "rigs": [rig], "backends": {"b": ["r"]}}
    )
    waker.compute = StubCompute(answers)
    return waker, waker.compute


class Clock:
    """rig-waker's ``time`` module with a clock the test moves (the rest is the real module)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class InlineThreads:
    """rig-waker's ``threading`` module whose threads run at once, in the caller's thread."""

    class Thread:
        def __init__(self, target: Any, args: tuple = (), daemon: bool = False) -> None:
            self.target, self.args = target, args

        def start(self) -> None:
            self.target(*self.args)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


def test_a_failed_recovery_waits_twice_as_long_each_time_up_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch looks every tenth of an interval on a clock the test moves: the n-th failed start
    puts the next WATCH * 2**(n-1) later (at most BACKOFF_CAP intervals), and no look before then
    starts anything."""
    module = load_waker()
    preempted = {"operationType": "compute.instances.preempted", "insertTime": "2026-12-01T10:00:00.000-08:00",
                 "name": "op-1", "status": "DONE"}  # fmt: skip
    # Every instances.start fails (a stockout).
    waker, compute = stub_waker(
        module,
        {
            "GET r": {"status": "TERMINATED", "id": "12"},
            "GET operations": {"items": [preempted]},
            "POST start": module.WakeError("ZONE_RESOURCE_POOL_EXHAUSTED in z"),
        },
    )
    clock = Clock()
    monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(module, "threading", InlineThreads())
    every, tries, start = waker.watch_every, [], clock.now
    while len(tries) < 9:
        sent = sum(call.startswith("POST") for call in compute.calls)
        waker.check(waker.rigs["r"])
        if sum(call.startswith("POST") for call in compute.calls) > sent:
            tries.append(round((clock.now - start) / every, 1))
        clock.now += every / 10
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(tries)]
    assert gaps == [1, 2, 4, 8, 16, 32, 32, 32] and module.BACKOFF_CAP == 32, tries
    assert (
        waker.recovery["r"]["attempts"] == 9
        and "ZONE_RESOURCE_POOL_EXHAUSTED" in waker.recovery["r"]["last_error"]
    )


def test_hostile_api_values_never_become_a_path_or_filter_unchecked() -> None:
    module = load_waker()
    for ident in ('1" OR name = "x', "../x", "", "1" * 21, None):
        waker, compute = stub_waker(module, {"GET r": {"status": "TERMINATED", "id": ident}})
        with pytest.raises(module.WakeError, match="answered an id"):
            waker.check(waker.rigs["r"])
        assert compute.calls == ["GET projects/p/zones/z/instances/r"]  # no list with it
    for name in ("../../global/operations/x", "op/x", "Op", "op?x=1", ""):
        waker, compute = stub_waker(
            module, {"GET r": {"status": "TERMINATED"}, "POST start": {"status": "RUNNING", "name": name}}
        )
        with pytest.raises(module.WakeError, match="an operation named"):
            waker._start(waker.rigs["r"], time.monotonic() + 5)
        assert not any("/operations/" in call for call in compute.calls)
    # Operations that are not objects, or carry no time, are no reason to start anything.
    items = [7, "x", {"operationType": "compute.instances.preempted", "insertTime": "yesterday"},
             {"operationType": "compute.instances.preempted"}]  # fmt: skip
    waker, compute = stub_waker(
        module, {"GET r": {"status": "TERMINATED", "id": "12"}, "GET operations": {"items": items}}
    )
    waker.check(waker.rigs["r"])
    assert compute.calls[-1] == 'GET projects/p/zones/z/operations {"filter": "targetId = \\"12\\""}'
    assert waker.recovery["r"]["attempts"] == 0


def test_a_rig_started_between_two_tries_ends_its_recovery() -> None:
    module = load_waker()
    waker, _ = stub_waker(module, {"GET r": {"status": "RUNNING", "id": "12"}})
    rec = waker.recovery["r"]
    rec.update(preempted_at="T", started="T1", attempts=2, last_error="stockout in z: ...", next_try=1e12)
    assert "recovering: stockout in z" in waker.status()["rigs"]["r"]["summary"]
    rec["next_try"] = 0.0  # the next look is due
    waker.check(waker.rigs["r"])
    assert waker.status()["rigs"]["r"]["summary"].startswith("preempted at T, started again at T1, up at ")


def test_a_request_during_a_recovery_waits_on_that_start(tmp_path: Path) -> None:
    with SpotStack(tmp_path, Faults(op_delay=1.0)) as spot:  # a start takes a second: room to arrive
        spot.power_on("rig-a")
        spot.event("rig-a", "preempt")
        wait(lambda: spot.starts() == ["rig-a"], "the recovery's start")
        assert chat(spot.sdk()) and spot.starts() == ["rig-a"]  # answered by rig-a, rig-b not started
        assert "waits on the start already under way for ['rig-a']" in spot.log


def test_a_request_whose_recovery_start_failed_tries_the_next_rig(tmp_path: Path) -> None:
    with SpotStack(tmp_path, Faults(op_delay=1.0)) as spot:
        spot.power_on("rig-a")
        spot.fake.api.faults.stockout_zones.add(ZONES["rig-a"])
        spot.event("rig-a", "preempt")
        wait(lambda: spot.starts() == ["rig-a"], "the recovery's start")
        assert chat(spot.sdk())
        assert "rig-b" in spot.starts()  # (the watch keeps trying rig-a meanwhile: its order varies)
        assert [e["path"] for e in spot.rigs["rig-b"].log if e["path"] != "/health"] == [
            "/v1/chat/completions"
        ]
        assert "it tries the backend's rigs itself" in spot.log


def metrics(stack: Stack) -> dict[str, float]:
    """GET /waker/metrics as {sample with its labels: value} (prometheus_client reads it)."""
    from prometheus_client.parser import text_string_to_metric_families

    answer = httpx.get(stack.url + "/waker/metrics", timeout=5)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith(
        "text/plain; version=0.0.4"
    )
    return {
        s.name + json.dumps(s.labels, sort_keys=True): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def starts(rig: str, reason: str, outcome: str) -> str:
    return "gemma_rig_waker_starts_total" + json.dumps({"outcome": outcome, "reason": reason, "rig": rig})


def test_the_metrics_count_a_preemption_and_the_starts(spot: SpotStack) -> None:
    assert chat(spot.sdk()) and spot.starts() == ["rig-a"]
    assert metrics(spot)[starts("rig-a", "wake", "ok")] == 1
    spot.event("rig-a", "preempt")
    wait(lambda: spot.status()["rig-a"]["up"], "rig-a up again")
    spot.more_looks("rig-a")  # more looks at the same preemption count nothing more
    got = metrics(spot)
    assert got['gemma_rig_waker_preemptions_total{"rig": "rig-a"}'] == 1
    assert got['gemma_rig_waker_preemptions_total{"rig": "rig-b"}'] == 0
    assert got[starts("rig-a", "recovery", "ok")] == 1 and got[starts("rig-a", "wake", "ok")] == 1
    assert got[starts("rig-a", "recovery", "failed")] == 0 and got[starts("rig-b", "wake", "ok")] == 0
    assert got['gemma_rig_waker_rig_stopped{"rig": "rig-a"}'] == 0  # preempted is not on purpose


def test_a_failed_recovery_start_is_counted_as_failed(tmp_path: Path) -> None:
    with SpotStack(tmp_path, Faults(op_delay=0.1)) as spot:
        spot.power_on("rig-a")
        spot.fake.api.faults.stockout_zones.add(ZONES["rig-a"])
        spot.event("rig-a", "preempt")
        wait(lambda: metrics(spot)[starts("rig-a", "recovery", "failed")] >= 1, "a failed start counted")
        assert metrics(spot)[starts("rig-a", "recovery", "ok")] == 0


def test_a_rig_stopped_on_purpose_is_marked_until_it_runs_again(spot: SpotStack) -> None:
    stopped = 'gemma_rig_waker_rig_stopped{"rig": "%s"}'
    spot.power_on("rig-a")
    spot.power_on("rig-b")
    spot.event("rig-a", "guestTerminate")
    with spot.fake.api.lock:
        spot.fake.api.instance_action(PROJECT, ZONES["rig-b"], "rig-b", "stop", {})
    wait(
        lambda: metrics(spot)[stopped % "rig-a"] == 1 and metrics(spot)[stopped % "rig-b"] == 1, "both marked"
    )
    assert chat(spot.sdk()) and spot.starts() == ["rig-a"]  # a request wakes rig-a: running again
    assert metrics(spot)[stopped % "rig-a"] == 0 and metrics(spot)[stopped % "rig-b"] == 1


class PlainStack(SpotStack):
    """The same watch over rigs that are not spot: it only tells whether each is stopped on purpose."""

    def config(self) -> dict:
        config = super().config()
        for rig in config["rigs"]:
            rig["spot"] = False
        return config


def test_the_watch_marks_a_rig_that_is_not_spot_too(tmp_path: Path) -> None:
    with PlainStack(tmp_path, Faults(op_delay=0.1)) as plain:
        plain.power_on("rig-a")
        plain.event("rig-a", "guestTerminate")
        wait(lambda: metrics(plain)['gemma_rig_waker_rig_stopped{"rig": "rig-a"}'] == 1, "rig-a marked")
        got = metrics(plain)
        assert not [k for k in got if "preemptions" in k or '"recovery"' in k]  # no spot rig here
        assert plain.status() == {} and plain.starts() == []


def test_the_metrics_are_for_local_clients_that_did_not_come_through_haproxy(spot: SpotStack) -> None:
    relayed = httpx.get(spot.url + "/waker/metrics", headers={"X-Gemma-Rig-Backend": "be_default"})
    assert relayed.status_code == 403 and spot.starts() == []
    assert "refused GET /waker/metrics from 127.0.0.1" in spot.log
    assert httpx.post(spot.url + "/waker/metrics", json={}).status_code == 400  # not the metrics: a request
    assert httpx.get(spot.url + "/waker/metrics?x=1").status_code == 400  # only the exact path
