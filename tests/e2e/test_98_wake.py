"""Wake on request on the local platform, end to end (docs/gateway.md, "Wake on request"): the
rig's container plays the VM, the fake Compute API plays the cloud (its instance rig-local follows
the container; instances.start and .stop run podman), and the gateway's rig-waker, holding only the
documented permissions, starts the stopped rig for a request from the official openai SDK
with its default settings. The cold wake's and a warm request's time to first token are measured
side by side (docs/wake.md). The rig is marked spot (gateway_wake_spot): the rig-waker's watch
starts it again after the fake API's preemption, and leaves the test's own stops to a request.

It runs after test_97, which leaves rig-local stopped by its idle stop, and before test_99, which
removes the rig whatever its state. gateway.yml reads what each rig serves on the rig itself, so
the fixture starts the container through the fake API before it stands the gateway up, and turns
off the 1-minute idle timer test_97 installed (the inventory's value is 0): here the stops are the
test's, at known times. The fake API runs in this process so that its request log can be read.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import openai
import pytest

from repack.tiny_facts import FACTS, Fact, messages
from tests.ansible_run import run_playbook
from tests.conftest import ROOT
from tests.e2e.rig import ENV_FILE, podman, rig_containers
from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_compute.podman import PodmanBacking

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "none"  # stopped by test_97's idle stop, or running: the fixture starts it either way

INVENTORY = ("-i", "inventory/local.yml", "-i", str(ROOT / "inventory" / "gateway-local.yml"))
# rig-local's instance as rig-waker names it: a local rig is its inventory name in project local, zone local-a.
INSTANCE = "projects/local/zones/local-a/instances/rig-local"
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
    """What the tests share: the fake API, the rig's container and the model it serves."""

    fake: FakeComputeServer
    container: str
    model: str
    gateway_seconds: float

    def starts(self) -> int:
        """How many instances.start the fake API has been asked for so far."""
        return len(self.fake.api.requests("POST", "/start"))

    def compute(self, verb: str, token: str = ADMIN_TOKEN) -> dict:
        """One instance action (start, stop) on rig-local through the fake API, waited on."""
        op = call(self.fake.endpoint, "POST", f"{INSTANCE}/{verb}", token)
        scope = INSTANCE.rsplit("/instances/", 1)[0]
        deadline = time.monotonic() + WAIT
        while op.get("status") != "DONE" and time.monotonic() < deadline:
            op = call(self.fake.endpoint, "POST", f"{scope}/operations/{op['name']}/wait", token)
        assert op.get("status") == "DONE" and not op.get("error"), op
        return op

    def stop(self) -> None:
        """Stop the rig through the API, then wait until HAProxy marks it down: the next request
        goes to rig-waker."""
        self.compute("stop")
        assert not running(self.container)
        until(lambda: gateway_state("rig-local").startswith("DOWN"), "HAProxy to mark rig-local down")


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


def recovery() -> str:
    """gateway-ctl status --text: each rig's line, with rig-waker's spot recovery."""
    return podman(
        "exec", "gemma-gateway", "/usr/local/libexec/gemma-rig/gateway-ctl", "status", "--text"
    ).stdout


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


@pytest.fixture(scope="module")
def wake(local_rig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wake]:
    """The fake API in front of rig-local's container and the gateway with wake on request
    pointed at it; the rig is left running, the gateway removed and the fake API stopped."""
    assert local_rig.container in rig_containers(), "no rig container: run the e2e files in order"
    permissions = {WAKER_TOKEN: set(MINIMAL), ADMIN_TOKEN: {*MINIMAL, "compute.instances.stop"}}
    fake = FakeComputeServer(Faults(op_delay=0.5), permissions=permissions).start()
    fake.api.seed_instance("local", "local-a", "rig-local", PodmanBacking(local_rig.container))
    state = Wake(fake, local_rig.container, local_rig.model, 0.0)
    try:
        # A rig whose idle stop is still under way (systemd "stopping") is let finish first.
        until(
            lambda: not running(local_rig.container) or booted(local_rig.container), "the rig to boot or stop"
        )
        if not running(local_rig.container):
            state.compute("start")
            until(lambda: booted(local_rig.container), "the rig's systemd to boot")
        timer = podman("exec", local_rig.container, "systemctl", "disable", "--now", "vllm-idle.timer")
        assert timer.returncode == 0 or "does not exist" in timer.stderr, timer.stderr
        # test_95 leaves the rig opened, with a key: the gateway (and so rig-waker) sends it.
        env = podman("exec", local_rig.container, "cat", ENV_FILE).stdout
        rig_key = dict(line.split("=", 1) for line in env.splitlines() if "=" in line).get("VLLM_API_KEY", "")
        settings = tmp_path_factory.mktemp("wake") / "gateway.json"
        settings.touch(mode=0o600)
        settings.write_text(json.dumps({
            "gateway_api_keys": {"e2e": KEY}, "gateway_rig_api_key": rig_key.strip('"'), "gateway_wake": True,
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
            down = run_playbook("teardown.yml", "-l", "gateway-local", *INVENTORY)
            assert down.rc == 0, down.output[-4000:]
            assert "gemma-gateway" not in rig_containers()
        finally:
            fake.stop()


def test_a_cold_request_wakes_the_stopped_rig_and_is_answered(wake: Wake, figure) -> None:
    """One streamed request for a stopped rig: one instances.start, the right answer; then a warm
    one. Their times to first token, side by side."""
    figure(
        "gateway.yml with wake on request (container, haproxy, rig-waker)", f"{wake.gateway_seconds:.0f} s"
    )
    wake.stop()
    client, before = sdk(), wake.starts()
    fact = FACTS[1]
    with explained():
        answer, cold = ask(client, wake.model, fact)
    assert answer == fact.answer
    assert wake.starts() == before + 1
    assert running(wake.container)
    until(lambda: gateway_state("rig-local") == "UP", "HAProxy to mark the woken rig up")
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
        call(wake.fake.endpoint, "POST", f"{INSTANCE}/stop", WAKER_TOKEN)
    assert refused.value.code == 403
    assert running(wake.container)


def test_eight_concurrent_cold_requests_start_the_rig_once(wake: Wake, figure) -> None:
    """Eight requests while the rig is stopped: one instances.start, eight right answers."""
    wake.stop()
    client, before = sdk(), wake.starts()
    facts = FACTS[8:16]
    start = time.monotonic()
    with explained(), ThreadPoolExecutor(max_workers=len(facts)) as pool:
        answers = list(pool.map(lambda f: ask(client, wake.model, f)[0], facts))
    seconds = time.monotonic() - start
    assert answers == [f.answer for f in facts]
    assert wake.starts() == before + 1
    figure("8 concurrent cold requests through the gateway", f"all answered in {seconds:.1f} s, 1 start")


def test_a_preempted_spot_rig_is_started_again_without_a_request(wake: Wake, figure) -> None:
    """The fake API preempts the running rig (its container stops, the API records
    compute.instances.preempted): rig-waker's watch starts it again, one instances.start, and
    gateway-ctl says what happened."""
    until(lambda: gateway_state("rig-local") == "UP", "the rig to be up before its preemption")
    before = wake.starts()
    preempt = urllib.request.Request(
        f"{wake.fake.endpoint}/fake-admin/zones/local-a/instances/rig-local/preempt", method="POST", data=b""
    )
    with urllib.request.urlopen(preempt, timeout=WAIT):
        pass
    preempted = time.monotonic()
    assert not running(wake.container)
    until(lambda: gateway_state("rig-local").startswith("DOWN"), "HAProxy to mark the preempted rig down")
    until(
        lambda: gateway_state("rig-local") == "UP",
        "rig-waker to start the preempted rig and HAProxy to see it",
    )
    figure(
        "preempted spot rig up again through the gateway",
        f"{time.monotonic() - preempted:.1f} s (watch {WATCH} s)",
    )
    assert wake.starts() == before + 1, waker_journal()
    # HAProxy's check can pass before rig-waker's own health poll records the rig up.
    until(
        lambda: "started again at" in recovery() and ", up at " in recovery(),
        "gateway-ctl to show the recovery",
    )
    assert "preempted at" in recovery()
    # The gateway host's Prometheus scrapes rig-waker: the preemption is an alert there.
    until(lambda: preempted_alert("firing"), "Prometheus to fire GemmaSpotPreempted for rig-local")
    figure("preemption -> GemmaSpotPreempted firing in Prometheus", f"{time.monotonic() - preempted:.1f} s")
    fact = FACTS[20]
    with explained():
        assert ask(sdk(), wake.model, fact)[0] == fact.answer
