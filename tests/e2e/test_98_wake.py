"""Wake on request and spot recovery on the local platform, end to end (docs/gateway.md, "Wake on
request"): each rig's container plays its VM, the fake Compute API plays the cloud (its instances
rig-local and rig-b follow the containers; instances.start and .stop run podman), and the gateway's
rig-waker, holding only the documented permissions, starts a stopped rig for a request from the
official openai SDK with its default settings. The cold wake's and a warm request's time to first
token are measured side by side (docs/wake.md). The rigs are marked spot (gateway_wake_spot): the
rig-waker's watch starts a rig again after the fake API's preemption, while the other rig serves
every request, and leaves the test's own stops to a request.

It runs after test_97, which leaves rig-local stopped by its idle stop, and before test_99. test_26
leaves rig-b's container stopped when this file runs later; the fixture starts both through the
fake API, puts rig-b on rig-local's build (one backend, two rigs), turns off the 1-minute idle timer
test_97 installed on rig-local (the inventory's value is 0: here the stops are the test's, at known
times), and at the end removes rig-b and the gateway. gateway.yml reads what each rig serves on
the rig itself, so both run before it. The fake API runs in this process so that its request log
can be read.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import openai
import pytest

from repack.tiny_facts import FACTS, Fact, messages
from tests.ansible_run import run_playbook
from tests.conftest import ROOT
from tests.e2e.conftest import FLEET_INVENTORY
from tests.e2e.rig import ENV_FILE, assert_serving, podman, rig_containers, wait_listed
from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_compute.podman import PodmanBacking

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "none"  # stopped by test_97's idle stop, or running: the fixture starts it either way

INVENTORY = (*FLEET_INVENTORY, "-i", str(ROOT / "inventory" / "gateway-local.yml"))
# Each rig's container and port; its instance as rig-waker names it: a local rig is its inventory
# name in project local, zone local-a.
RIGS = {"rig-local": ("gemma-rig", 8000), "rig-b": ("gemma-rig-b", 8001)}
SCOPE = "projects/local/zones/local-a"
INSTANCE = f"{SCOPE}/instances/rig-local"
WAKER_TOKEN = "waker-e2e-0123456789"  # test-only tokens of the fake's permissions table
ADMIN_TOKEN = "admin-e2e-0123456789"  # the test's own: it stops the rig
# The waker's permissions as docs/gateway.md gives its service account, nothing more.
MINIMAL = {
    "compute.instances.get",
    "compute.instances.start",
    "compute.zoneOperations.get",
    "compute.zoneOperations.list",
}
KEY = "sk-wake-e2e-0123456789abcdef"  # a test-only gateway key
URL = "https://127.0.0.1:8443"  # gateway_port, gateway-local's gateway_address
CERT = ROOT / "build" / "gateway" / "gateway-local.crt"  # gateway_controller_dir
WAIT = 300  # seconds any one state change (a stop, a health check's verdict) may take here
WATCH = 5  # gateway_wake_watch_seconds: spot recovery looks this often (30 by default)


@dataclass
class Wake:
    """What the tests share: the fake API, the rigs' containers and the model both serve."""

    fake: FakeComputeServer
    model: str
    rig_key: str = ""
    gateway_seconds: float = 0.0

    def starts(self) -> int:
        """How many instances.start the fake API has been asked for so far."""
        return len(self.fake.api.requests("POST", "/start"))

    def compute(self, rig: str, verb: str, token: str = ADMIN_TOKEN) -> dict:
        """One instance action (start, stop) on ``rig`` through the fake API, waited on."""
        op = call(self.fake.endpoint, "POST", f"{SCOPE}/instances/{rig}/{verb}", token)
        deadline = time.monotonic() + WAIT
        while op.get("status") != "DONE" and time.monotonic() < deadline:
            op = call(self.fake.endpoint, "POST", f"{SCOPE}/operations/{op['name']}/wait", token)
        assert op.get("status") == "DONE" and not op.get("error"), op
        return op

    def stop_all(self) -> None:
        """Stop every rig through the API, then wait until HAProxy marks them down: the next
        request goes to rig-waker."""
        for rig, (container, _) in RIGS.items():
            if running(container):
                self.compute(rig, "stop")
            assert not running(container)
        for rig in RIGS:
            until(lambda rig=rig: gateway_state(rig).startswith("DOWN"), f"HAProxy to mark {rig} down")

    def up(self) -> list[str]:
        """The rigs whose containers run."""
        return [rig for rig, (container, _) in RIGS.items() if running(container)]

    def start_all(self) -> None:
        """Start the stopped rigs through the API and wait until HAProxy has every rig up."""
        for rig, (container, _) in RIGS.items():
            if not running(container):
                self.compute(rig, "start")
        for rig in RIGS:
            until(lambda rig=rig: gateway_state(rig) == "UP", f"HAProxy to mark {rig} up")


def call(endpoint: str, method: str, path: str, token: str) -> dict:
    request = urllib.request.Request(
        f"{endpoint}/compute/v1/{path}", method=method, data=b"" if method == "POST" else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=WAIT) as answer:
        return json.load(answer)


def running(container: str) -> bool:
    return podman("inspect", "-f", "{{.State.Running}}", container).stdout.strip() == "true"


def until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"waited {WAIT} s for {what}"
        time.sleep(0.5)


def preempted_alert(state: str) -> bool:
    """Whether the gateway host's Prometheus has GemmaSpotPreempted for rig-local in ``state``."""
    query = urllib.parse.urlencode({"query": 'ALERTS{alertname="GemmaSpotPreempted",rig="rig-local"}'})
    with urllib.request.urlopen(f"http://127.0.0.1:9090/api/v1/query?{query}", timeout=10) as answer:
        result = json.load(answer)["data"]["result"]
    return any(r["metric"].get("alertstate") == state for r in result)


def gateway_state(rig: str) -> str:
    """The rig's state in HAProxy (UP, DOWN, ...), from gateway-ctl."""
    result = podman("exec", "gemma-gateway", "/usr/local/libexec/gemma-rig/gateway-ctl", "status")
    assert result.returncode == 0, result.stderr
    return next(row["state"] for row in json.loads(result.stdout) if row["rig"] == rig)


def waker_journal() -> str:
    """rig-waker's last decisions (one line each), for a failure's message."""
    result = podman("exec", "gemma-gateway", "journalctl", "-u", "gemma-rig-waker", "-n", "40", "--no-pager")
    return result.stdout + result.stderr


@contextmanager
def explained() -> Iterator[None]:
    """An API error from the gateway fails the test with rig-waker's journal beside it."""
    try:
        yield
    except openai.APIError as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc}\nrig-waker's journal:\n{waker_journal()}") from exc


def recovery(rig: str = "rig-local") -> str:
    """gateway-ctl status --text: ``rig``'s line, with rig-waker's spot recovery."""
    text = podman(
        "exec", "gemma-gateway", "/usr/local/libexec/gemma-rig/gateway-ctl", "status", "--text"
    ).stdout
    return "\n".join(line for line in text.splitlines() if line.startswith(rig))


def booted(container: str) -> bool:
    state = podman("exec", container, "systemctl", "is-system-running").stdout.strip()
    return state in ("running", "degraded")


def sdk() -> openai.OpenAI:
    """The official SDK with its default settings: only the address, the key and the CA differ."""
    tls = ssl.create_default_context(cafile=str(CERT))
    client = openai.OpenAI(
        base_url=f"{URL}/v1", api_key=KEY, http_client=openai.DefaultHttpxClient(verify=tls)
    )
    assert client.max_retries == openai.DEFAULT_MAX_RETRIES and client.timeout == openai.DEFAULT_TIMEOUT
    return client


def ask(client: openai.OpenAI, model: str, fact: Fact) -> tuple[str, float]:
    """Ask one fact, streamed, greedy: (the answer, seconds to its first content)."""
    start = time.monotonic()
    first, text = 0.0, []
    for chunk in client.chat.completions.create(
        model=model, messages=messages(fact.question), max_tokens=16, temperature=0.0, stream=True
    ):
        content = chunk.choices[0].delta.content if chunk.choices else None
        if content:
            first = first or time.monotonic() - start
            text.append(content)
    return "".join(text), first


def rig_key(container: str) -> str:
    """The key the rig's tpu.env holds (test_95 leaves rig-local opened with one), or ''."""
    env = podman("exec", container, "cat", ENV_FILE).stdout
    return (
        dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
        .get("VLLM_API_KEY", "")
        .strip('"')
    )


@pytest.fixture(scope="module")
def wake(local_rig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wake]:
    """The fake API in front of both rigs' containers, rig-b on rig-local's build, and the gateway
    with wake on request pointed at them; rig-local is left running, rig-b and the gateway removed,
    the fake API stopped."""
    assert {"gemma-rig", "gemma-rig-b"} <= set(rig_containers()), "run the e2e files in order"
    permissions = {WAKER_TOKEN: set(MINIMAL), ADMIN_TOKEN: {*MINIMAL, "compute.instances.stop"}}
    fake = FakeComputeServer(Faults(op_delay=0.5), permissions=permissions).start()
    for rig, (container, _) in RIGS.items():
        fake.api.seed_instance("local", "local-a", rig, PodmanBacking(container))
    state = Wake(fake, local_rig.model)
    try:
        for rig, (container, _) in RIGS.items():
            # A rig whose idle stop is still under way (systemd "stopping") is let finish first.
            until(lambda c=container: not running(c) or booted(c), f"{rig} to boot or stop")
            if not running(container):
                state.compute(rig, "start")
                until(lambda c=container: booted(c), f"{rig}'s systemd to boot")
        timer = podman("exec", "gemma-rig", "systemctl", "disable", "--now", "vllm-idle.timer")
        assert timer.returncode == 0 or "does not exist" in timer.stderr, timer.stderr
        state.rig_key = rig_key("gemma-rig")
        if wait_listed(8001) != local_rig.model:  # test_25's rolling swap left rig-b on another build
            swap = run_playbook("swap.yml", "-l", "rig-b", "-e", f"model={local_rig.model}", *FLEET_INVENTORY)
            assert swap.rc == 0, swap.output[-4000:]
        assert_serving("gemma-rig-b", 8001, local_rig.model)
        settings = tmp_path_factory.mktemp("wake") / "gateway.json"
        settings.touch(mode=0o600)
        settings.write_text(json.dumps({
            "gateway_api_keys": {"e2e": KEY}, "gateway_rig_api_key": state.rig_key, "gateway_wake": True,
            "gateway_wake_api": fake.endpoint, "gateway_wake_token": WAKER_TOKEN,
            "gateway_wake_watch_seconds": WATCH, "gateway_wake_spot": True,
        }))  # fmt: skip
        run = run_playbook("gateway.yml", *INVENTORY, "-e", f"@{settings}")
        assert run.rc == 0, run.output[-6000:]
        state.gateway_seconds = run.seconds
        unit = podman("exec", "gemma-gateway", "systemctl", "is-active", "gemma-rig-waker")
        assert unit.stdout.strip() == "active", waker_journal()
        yield state
    finally:
        try:
            down = run_playbook("teardown.yml", "-l", "rig-b,gateway-local", *INVENTORY)
            assert down.rc == 0, down.output[-4000:]
            assert not {"gemma-gateway", "gemma-rig-b"} & set(rig_containers())
        finally:
            fake.stop()


def test_a_cold_request_wakes_a_stopped_rig_and_is_answered(wake: Wake, figure) -> None:
    """One streamed request while both rigs are stopped: one instances.start, the right answer;
    then warm ones. Their times to first token, side by side."""
    figure(
        "gateway.yml with wake on request (container, haproxy, rig-waker)", f"{wake.gateway_seconds:.0f} s"
    )
    wake.stop_all()
    client, before = sdk(), wake.starts()
    fact = FACTS[1]
    with explained():
        answer, cold = ask(client, wake.model, fact)
    assert answer == fact.answer
    assert wake.starts() == before + 1
    (woken,) = wake.up()
    until(lambda: gateway_state(woken) == "UP", "HAProxy to mark the woken rig up")
    warm = []
    for fact in FACTS[2:7]:
        answer, first = ask(client, wake.model, fact)
        assert answer == fact.answer
        warm.append(first)
    assert wake.starts() == before + 1
    figure(
        "time to first token through the gateway, local rig (streamed, tiny model)",
        f"cold wake {cold:.1f} s (container start, boot, vLLM load, rig-waker's 2 s health poll); "
        f"warm median {sorted(warm)[len(warm) // 2] * 1000:.0f} ms of {len(warm)}",
    )
    # The waker's token starts rigs and nothing else: the same API refuses it a stop.
    with pytest.raises(urllib.error.HTTPError) as refused:
        call(wake.fake.endpoint, "POST", f"{SCOPE}/instances/{woken}/stop", WAKER_TOKEN)
    assert refused.value.code == 403
    assert wake.up() == [woken]


def test_eight_concurrent_cold_requests_start_one_rig(wake: Wake, figure) -> None:
    """Eight requests while both rigs are stopped: one instances.start, eight right answers."""
    wake.stop_all()
    client, before = sdk(), wake.starts()
    facts = FACTS[8:16]
    start = time.monotonic()
    with explained(), ThreadPoolExecutor(max_workers=len(facts)) as pool:
        answers = list(pool.map(lambda f: ask(client, wake.model, f)[0], facts))
    seconds = time.monotonic() - start
    assert answers == [f.answer for f in facts]
    assert wake.starts() == before + 1 and len(wake.up()) == 1
    figure("8 concurrent cold requests through the gateway", f"all answered in {seconds:.1f} s, 1 start")


@dataclass
class Load:
    """Streamed fact questions through the gateway, one after another, until told to stop."""

    model: str
    answered: list[tuple[float, str]] = field(default_factory=list)  # (when, the rig that answered)
    failed: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client, n = sdk(), 0
        while not self.done.is_set():
            fact = FACTS[n % len(FACTS)]
            n += 1
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=self.model, messages=messages(fact.question), max_tokens=16, temperature=0.0
                )
                choice = raw.parse().choices[0]
                answer = choice.message.content
                if answer != fact.answer:
                    by = raw.headers.get("x-gemma-rig")
                    self.failed.append(f"{fact.question!r}: {answer!r} ({choice.finish_reason}, from {by})")
                self.answered.append((time.monotonic(), raw.headers.get("x-gemma-rig", "")))
            except openai.APIError as exc:
                self.failed.append(f"{type(exc).__name__}: {exc}")


def test_a_preempted_spot_rig_is_started_again_while_the_other_serves(wake: Wake, figure) -> None:
    """Both rigs up, requests flowing through the gateway; the fake API preempts rig-local (its
    container shuts down: vLLM drains, then stops; the API records compute.instances.preempted).
    Every request meanwhile is answered, by rig-b; a stream rig-local could not finish in its drain
    ends with the error event the SDK raises; rig-waker's watch starts rig-local again, one
    instances.start, and gateway-ctl says what happened."""
    wake.start_all()
    before = wake.starts()
    direct = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=wake.rig_key or "none")
    long = direct.chat.completions.create(
        model=wake.model, messages=messages("Tell me a long story."), max_tokens=1800, temperature=1.0,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    streamed = [next(iter(long))]
    load = Load(wake.model)
    worker = threading.Thread(target=load.run, daemon=True)
    worker.start()
    until(lambda: len(load.answered) >= 5, "the load to flow through the gateway")
    preempt = urllib.request.Request(
        f"{wake.fake.endpoint}/fake-admin/zones/local-a/instances/rig-local/preempt", method="POST", data=b""
    )
    preempted = time.monotonic()
    with urllib.request.urlopen(preempt, timeout=WAIT):
        pass
    try:
        assert not running("gemma-rig")
        with pytest.raises(openai.APIError, match="the rig is stopping") as ended:
            streamed.extend(long)
        assert not isinstance(ended.value, openai.APIConnectionError), ended.value  # an event, not a cut
        down = time.monotonic()  # the container has stopped: rig-local can answer nothing from here
        seen_down: list[float] = []

        def up_again() -> bool:
            looked = time.monotonic()
            if gateway_state("rig-local") == "UP":
                return True
            seen_down.append(looked)  # HAProxy had it down then: a request answered before, by rig-b
            return False

        until(up_again, "rig-waker to start the preempted rig and HAProxy to see it")
        back = time.monotonic()
        until(
            lambda: any(rig == "rig-local" for when, rig in load.answered if when > back),
            "rig-local to answer",
        )
    finally:
        load.done.set()
        worker.join(timeout=60)
    assert seen_down, "HAProxy never had the preempted rig down"
    during = [rig for when, rig in load.answered if down <= when <= seen_down[-1]]
    figure(
        "preempted spot rig up again through the gateway, the other rig serving",
        f"{back - preempted:.1f} s (watch {WATCH} s); {len(load.answered)} requests, "
        f"{len(during)} while it was down, {len(load.failed)} failed",
    )
    assert load.failed == [], load.failed
    assert during and set(during) == {"rig-b"}, during
    assert len(streamed) > 1  # the long stream had begun before the preemption ended it
    assert wake.starts() == before + 1, waker_journal()
    # HAProxy's check can pass before rig-waker's own health poll records the rig up.
    until(
        lambda: "started again at" in recovery() and ", up at " in recovery(),
        "gateway-ctl to show the recovery",
    )
    assert "preempted at" in recovery()
    assert "preempted" not in recovery("rig-b")
    # The gateway host's Prometheus scrapes rig-waker: the preemption is an alert there.
    until(lambda: preempted_alert("firing"), "Prometheus to fire GemmaSpotPreempted for rig-local")
    figure("preemption -> GemmaSpotPreempted firing in Prometheus", f"{time.monotonic() - preempted:.1f} s")
