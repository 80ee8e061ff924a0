"""The gateway in front of the two-rig fleet: a rolling swap through it that no client notices,
a broken model rolled back, and a rig whose vLLM dies is taken out within the health-check
interval. The rig's own swaps are proven here too (see test_10_swap): W8A8 answering its facts,
the rollback to the very checkpoint served before, and the plain swap back to the default.

A steady stream of chats goes through the gateway (TLS, an API key) with the official `openai` SDK,
without its retries: every failure counts. They stream, but for the kill of a rig's vLLM: there
each request is answered whole (the gateway sends one the dead rig held to the other), and one
stream, which has begun and cannot be sent again, must make the SDK raise. The requests take turns
naming no model (the gateway sends them to any rig up), the catalog's alias (every tiny build
answers to it), and a build. Each answer's `model` (vLLM names the build, whichever name was asked)
and the X-Gemma-Rig header say which rig answered with which build. test_20 hands the fleet over as
site.yml stood it up (both rigs on tiny-emb4); this file's rolling swap takes both to tiny-w8a8 (it
is the project's only rolling swap: one rig at a time, in the inventory's order), and the last test
swaps rig-local back to tiny-emb4 with plain swap.yml for the files after it. Each test also stands
alone: the fixtures bring the fleet, the gateway and, where a test needs it, a swap.
"""

from __future__ import annotations

import json
import re
import ssl
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from repack import tiny_facts
from tests.ansible_run import run_playbook
from tests.conftest import ROOT
from tests.e2e.agents import (
    assert_calls_the_tool,
    assert_json_schema_answer,
    assert_streamed_call_is_the_same,
)
from tests.e2e.conftest import GATEWAY_CLIENTS, GATEWAY_INVENTORY, gateway_down, runs_later
from tests.e2e.kill import kill_controller, start_playbook
from tests.e2e.rig import (
    assert_knows_the_facts,
    assert_serving,
    chat,
    podman,
    served_build,
    swap_downtime,
    unit_started_at,
)

sys.path.insert(0, str(ROOT / "measure"))
import gateway_overhead

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "fleet"  # rig-local and rig-b on tiny-emb4, as test_20 hands them over

INVENTORY = GATEWAY_INVENTORY
RIGS = {"rig-local": ("gemma-rig", 8000), "rig-b": ("gemma-rig-b", 8001)}
KEY = GATEWAY_CLIENTS["e2e"]
URL = "https://127.0.0.1:8443"  # gateway_port, gateway-local's gateway_address
CERT = ROOT / "build" / "gateway" / "gateway-local.crt"  # gateway_controller_dir
# Requests started per second: enough to have requests in flight in each phase of a swap, and no
# more than one rig can carry while the other starts vLLM on the same 2 cores (at 2 a second an
# AVX2-only host queued them for minutes: docs/gateway.md).
RATE = 1.0
ALIAS = "tiny-gemma-4"  # the tiny builds' alias in the catalog
NO_MODEL = ""  # a request that names no model: vLLM serves it with whatever it serves


@dataclass
class Answer:
    start: float  # time.time(): comparable with the rigs' and the gateway's journals
    asked: str = NO_MODEL  # the model the request named
    status: int = 0  # the HTTP status of a refused request
    end: float = 0.0
    first: float = 0.0  # time to the first content
    rig: str = ""
    model: str = ""
    completed: bool = False
    error: str = ""


@dataclass
class Load:
    """Chats through the gateway at a steady rate, each in its own thread, naming each of ``names``
    in turn; streamed unless ``stream`` is false; ``ignore_eos``: each generates ``max_tokens``."""

    max_tokens: int = 8
    names: tuple[str, ...] = (NO_MODEL,)
    stream: bool = True
    ignore_eos: bool = False
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        http = httpx.Client(verify=ssl.create_default_context(cafile=str(CERT)), timeout=120)
        self.client = openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, max_retries=0, http_client=http)
        self._pacer = threading.Thread(target=self._run, daemon=True)

    def _one(self, answer: Answer) -> None:
        try:
            raw = self.client.chat.completions.with_raw_response.create(
                model=answer.asked,
                messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=self.max_tokens,
                stream=self.stream,
                extra_body={"ignore_eos": True} if self.ignore_eos else None,
            )
            answer.rig = raw.headers.get("x-gemma-rig", "")
            for chunk in raw.parse() if self.stream else [raw.parse()]:
                answer.model = chunk.model
                choice = chunk.choices[0] if chunk.choices else None
                text = choice and (choice.delta.content if self.stream else choice.message.content)
                if not answer.first and text:
                    answer.first = time.time() - answer.start
                if choice and choice.finish_reason:
                    answer.completed = True
        except Exception as exc:  # every failure is counted, whatever its kind
            answer.error = f"{type(exc).__name__}: {exc}"
            answer.status = getattr(exc, "status_code", 0)
        answer.end = time.time()

    def _run(self) -> None:
        while not self._stop.is_set():
            answer = Answer(time.time(), self.names[len(self.answers) % len(self.names)])
            self.answers.append(answer)
            thread = threading.Thread(target=self._one, args=(answer,), daemon=True)
            thread.start()
            self._threads.append(thread)
            self._stop.wait(1 / RATE)

    def __enter__(self) -> Load:
        self._pacer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._pacer.join()
        for thread in self._threads:
            thread.join(timeout=180)

    def failed(self, asked: str | None = None) -> list[Answer]:
        """The requests that got no whole answer (of those naming ``asked``, if given)."""
        return [a for a in self.asking(asked) if a.error or not a.completed]

    def asking(self, asked: str | None) -> list[Answer]:
        return [a for a in self.answers if asked is None or a.asked == asked]

    def tally(self) -> str:
        """How many requests naming each name were answered, for a figure."""
        return "; ".join(
            f"{name or 'no model'}: {len(self.asking(name)) - len(self.failed(name))}/{len(self.asking(name))} answered"
            for name in self.names
        )


def latency_figure(answers: list[Answer]) -> str:
    total = sorted(a.end - a.start for a in answers)
    first = sorted(a.first for a in answers if a.first)
    p95 = total[int(0.95 * (len(total) - 1))]
    return (
        f"{len(answers)} streamed chats, median {statistics.median(total) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
        f"max {total[-1] * 1000:.0f} ms; first token median {statistics.median(first) * 1000:.0f} ms"
    )


def gateway_status() -> dict[str, dict]:
    result = podman("exec", "gemma-gateway", "/usr/local/libexec/gemma-rig/gateway-ctl", "status")
    assert result.returncode == 0, result.stderr
    return {row["rig"]: row for row in json.loads(result.stdout)}


@pytest.fixture(scope="module", autouse=True)
def hand_back(request: pytest.FixtureRequest, local_rig):
    """The gateway and rig-b go when this file ends, unless test_26 takes them over."""
    yield
    if not runs_later(request, "test_26_metrics"):
        gateway_down(local_rig)


def test_rolling_swap_through_the_gateway_no_client_notices(gateway, local_rig, figure) -> None:
    """No client that names no model or the alias notices; one naming the old build is answered
    by it while a rig takes it, then gets vLLM's 404 naming it, and nothing else."""
    keys, up = gateway
    figure(
        "site.yml gateway.yml (the fleet converged; container, haproxy, TLS, config)", f"{up.seconds:.0f} s"
    )
    old = served_build(local_rig.port)
    new = local_rig.model if old != local_rig.model else "tiny-w8a8"
    with Load(names=(NO_MODEL, ALIAS, old)) as load:
        time.sleep(3)
        run = run_playbook("swap.yml", "-e", f"model={new}", "-e", f"@{keys}", *INVENTORY)
        time.sleep(3)
    assert run.rc == 0, run.output[-6000:]
    figure(
        f"rolling swap {old} -> {new} of two rigs through the gateway",
        f"playbook {run.seconds:.0f} s; slowest tasks: {run.slowest()}",
    )
    figure("latency through the gateway during the swap", latency_figure(load.answers))
    figure("requests through the gateway during the swap, by the model they named", load.tally())
    for name in (NO_MODEL, ALIAS):
        failed = load.failed(name)
        assert not failed, f"naming {name!r}: {len(failed)} failed: {[a.error for a in failed][:5]}"
    # Naming the old build: its answers came from it; once no rig took it, vLLM's 404 naming it,
    # and only after rig-local had switched (rig-b still served it until its own drain).
    assert {a.model for a in load.asking(old) if a.completed} == {old}
    gone = load.failed(old)
    assert gone, "no request named the old build once no rig served it: the swap was too quick to see"
    assert all(a.status == 404 and f"The model `{old}` does not exist." in a.error for a in gone), [
        a.error for a in gone
    ][:5]
    first_new_start = min(a.start for a in load.answers if a.rig == "rig-local" and a.model == new)
    assert min(a.start for a in gone) > first_new_start
    for container, port in RIGS.values():
        assert_serving(container, port, new)
        assert_knows_the_facts(port, new, figure)
    # Each rig answered with the old model, then only with the new one: it changed at its own swap.
    by_start = sorted((a for a in load.answers if a.completed), key=lambda a: a.start)
    for rig in RIGS:
        models = [a.model for a in by_start if a.rig == rig]
        assert models[0] == old and models[-1] == new, (rig, models)
        switched = models.index(new)
        assert set(models[switched:]) == {new}, (rig, models)
    # One rig at a time: rig-local answered with the new model while rig-b still had the old one,
    # the playbook said so in that order, and rig-b's unit started after rig-local's.
    first_new_local = min(a.end for a in load.answers if a.rig == "rig-local" and a.model == new)
    last_old_b = max(a.start for a in load.answers if a.rig == "rig-b" and a.model == old)
    assert first_new_local < last_old_b
    assert run.output.index(f"rig-local: {old} -> {new}") < run.output.index(f"rig-b: {old} -> {new}")
    assert started_seconds("gemma-rig-b") > started_seconds("gemma-rig")
    # The gateway now routes and lists the new build and the alias only.
    with httpx.Client(verify=ssl.create_default_context(cafile=str(CERT)), timeout=60) as http:
        headers = {"Authorization": f"Bearer {KEY}"}
        listed = http.get(f"{URL}/v1/models", headers=headers).json()
        assert [m["id"] for m in listed["data"]] == sorted([new, ALIAS])
        assert http.get(f"{URL}/v1/models").status_code == 401


def started_seconds(container: str) -> float:
    """The unit's last start on the host-wide monotonic clock (containers share it), in seconds."""
    return int(unit_started_at(container).split("=")[1]) / 1e6


@pytest.fixture
def swapped_away(gateway, local_rig) -> str:
    """rig-local serving another build than the inventory's, as the rolling swap leaves it; alone,
    this test swaps rig-local (only) to tiny-w8a8 through the gateway first. The served build."""
    if served_build(local_rig.port) == local_rig.model:
        keys, _ = gateway
        limit = ("-l", "rig-local,gateway-local,localhost")
        run = run_playbook("swap.yml", "-e", "model=tiny-w8a8", "-e", f"@{keys}", *limit, *INVENTORY)
        assert run.rc == 0, run.output[-6000:]
    served = served_build(local_rig.port)
    assert served != local_rig.model
    return served


def test_query_and_status_follow_the_served_model(swapped_away, local_rig) -> None:
    """After the rolling swap rig-local serves another model than the inventory says: query.yml
    (the default inventory, no gateway) asks the served model (not a 404 for the inventory's) and
    status.yml says which it is and that the inventory differs."""
    served = swapped_away
    query = run_playbook("playbooks/query.yml", "-e", "max_tokens=16")
    assert query.rc == 0, query.output[-6000:]
    assert f"{served}: " in query.output and "does not exist" not in query.output
    status = run_playbook("playbooks/status.yml")
    assert status.rc == 0, status.output[-6000:]
    said = " ".join(status.output.split())  # the YAML callback folds long lines
    assert (
        f"model: {served} (also answers to {ALIAS}) (the inventory says {local_rig.model}: swapped since site.yml)"
        in said
    ), status.output[-3000:]


def test_status_and_query_through_the_gateway(gateway) -> None:
    keys, _ = gateway
    status = run_playbook("playbooks/status.yml", "-e", f"@{keys}", *INVENTORY)
    assert status.rc == 0, status.output[-6000:]
    assert "gateway gateway-local at https://127.0.0.1:8443" in status.output
    for rig in RIGS:
        assert f"{rig}: UP" in status.output, status.output[-3000:]
    query = run_playbook(
        "playbooks/query.yml", "-e", "via_gateway=true", "-e", "max_tokens=8", "-e", f"@{keys}", *INVENTORY
    )
    assert query.rc == 0, query.output[-6000:]
    assert "answered by rig-" in query.output and "through https://127.0.0.1:8443" in query.output
    assert KEY not in status.output + query.output


def test_an_agent_through_the_gateway(gateway) -> None:
    """With the official openai SDK over TLS and a key, naming the alias (docs/agents.md): a tool call
    comes back parsed, whole and streamed, and a json_schema answer validates, as from the rig itself
    (test_05_rig_contract), whichever rig and tiny build answers."""
    http = httpx.Client(verify=ssl.create_default_context(cafile=str(CERT)), timeout=120)
    client = openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, max_retries=0, http_client=http)
    assert_calls_the_tool(client, ALIAS, tiny_facts.TOOL_ASKS[:1])
    assert_streamed_call_is_the_same(client, ALIAS)
    assert_json_schema_answer(client, ALIAS)


def test_overhead_per_request(gateway, local_rig, figure) -> None:
    """The same requests to rig-local directly and through the gateway (TLS, key, routing by model),
    interleaved, on kept-alive connections: the difference of the medians is the gateway's cost;
    then the throughput at 8 concurrent requests, side by side. rig-b is drained meanwhile, so both
    go to the same vLLM."""
    model = served_build(local_rig.port)
    ctl = ("exec", "gemma-gateway", "/usr/local/libexec/gemma-rig/gateway-ctl")
    # Only the served paths (rig_served_paths): a one-token completion is the cheapest request left.
    timings: dict[str, dict[str, list[float]]] = {"completion": {}, "chat": {}}
    requests = {
        "completion": ("/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1}, 40),
        "chat": (
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
            20,
        ),
    }
    tls = ssl.create_default_context(cafile=str(CERT))
    assert podman(*ctl, "drain", "rig-b").returncode == 0
    with (
        httpx.Client(base_url=f"http://127.0.0.1:{local_rig.port}", timeout=60) as direct,
        httpx.Client(base_url=URL, verify=tls, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as via,
    ):
        for kind, (path, body, n) in requests.items():
            for _ in range(n + 2):  # the first two warm the connections up
                for name, client in (("direct", direct), ("gateway", via)):
                    started = time.perf_counter()
                    response = client.post(path, json=body)
                    assert response.status_code == 200, response.text
                    timings[kind].setdefault(name, []).append(time.perf_counter() - started)
                    if name == "gateway":
                        assert response.headers["x-gemma-rig"] == "rig-local"
    # Throughput at 8 concurrent requests, direct and through the gateway, rounds alternating
    # (measure/gateway_overhead.py; docs/gateway.md's target: 5% loss at most). A figure, not a
    # timed assertion: the run's output reports it.
    bench = gateway_overhead.measure(
        f"http://127.0.0.1:{local_rig.port}", URL, model, key=KEY, cafile=str(CERT),
        concurrency=8, requests=32, rounds=4, max_tokens=32,
    )  # fmt: skip
    assert podman(*ctl, "ready", "rig-b").returncode == 0
    assert {r.endpoint for r in bench.rounds} == {"direct", "gateway"}
    assert all(r.tokens == 32 * 32 for r in bench.rounds), bench.rounds  # ignore_eos: the same work on both
    figure("throughput on rig-local at c=8: direct vs through the gateway", bench.summary())
    for kind, by in timings.items():
        direct_ms = statistics.median(by["direct"][2:]) * 1000
        via_ms = statistics.median(by["gateway"][2:]) * 1000
        figure(
            f"{kind} on rig-local: direct vs through the gateway (medians of {len(by['direct']) - 2})",
            f"{direct_ms:.1f} ms vs {via_ms:.1f} ms: +{via_ms - direct_ms:.1f} ms per request",
        )


def journal_time(container: str, unit: str, pattern: str) -> float:
    """When a unit's journal in a container last logged a line matching ``pattern`` (epoch s)."""
    result = podman(
        "exec", container, "journalctl", "-u", unit, "-o", "short-unix", "--no-pager", "-g", pattern
    )
    lines = [line for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert lines, f"{container}: no {pattern!r} in {unit}'s journal"
    return float(lines[-1].split()[0])


def test_a_broken_model_rolls_back_and_the_rig_is_put_back(
    gateway,
    local_rig,
    broken_catalog,
    figure,
) -> None:
    keys, _ = gateway
    served = served_build(local_rig.port)
    old = assert_serving(local_rig.container, local_rig.port, served)
    b_started = unit_started_at("gemma-rig-b")
    with Load(names=(NO_MODEL, ALIAS, served)) as load:
        time.sleep(2)
        run = run_playbook(
            "swap.yml", "-e", "model=tiny-broken", "-e", f"@{broken_catalog}", "-e", f"@{keys}", *INVENTORY
        )
        time.sleep(3)
    assert run.rc != 0
    assert f"swap {served} -> tiny-broken failed on rig-local" in run.output, run.output[-6000:]
    assert f"Rolled back: {served} is serving again" in run.output
    assert unit_started_at("gemma-rig-b") == b_started  # the rollout stopped at rig-local
    failed = load.failed()
    figure(
        "failed swap through the gateway, rolled back",
        f"{run.seconds:.0f} s, {len(failed)} of {len(load.answers)} requests failed ({load.tally()}); "
        f"slowest tasks: {run.slowest()}",
    )
    assert not failed, [(a.asked, a.error) for a in failed][:5]
    # rig-local is back in service at the gateway, routed for its old model, and answers again.
    status = gateway_status()
    assert status["rig-local"]["state"].startswith("UP") and status["rig-local"]["model"] == served, status
    assert status["rig-local"]["alias"] == ALIAS, status
    assert "rig-local: put back in service for " + served in run.output
    assert served_through_the_gateway_by("rig-local", served)
    # The old checkpoint, the same version, again: what the rollback put back is what served before.
    assert assert_serving(local_rig.container, local_rig.port, served).target == old.target
    assert chat(local_rig.port, served)["usage"]["completion_tokens"] > 0


def served_through_the_gateway_by(rig: str, model: str, tries: int = 20) -> bool:
    """Whether ``rig`` answers some of ``tries`` requests naming ``model`` one after another (the
    gateway sends each to the rig with the fewest in flight, so both rigs take turns)."""
    with httpx.Client(verify=ssl.create_default_context(cafile=str(CERT)), timeout=60) as http:
        for _ in range(tries):
            response = http.post(
                f"{URL}/v1/chat/completions",
                headers={"Authorization": f"Bearer {KEY}"},
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": "Say hello."}],
                    "max_tokens": 2,
                },
            )
            assert response.status_code == 200, response.text
            if response.headers["x-gemma-rig"] == rig:
                return True
    return False


def drained_by_a_dead_controller(keys, tmp_path, to: str) -> None:
    """Start swap.yml to ``to`` through the gateway and kill the controller (SIGKILL, everything
    under it) as soon as the gateway shows rig-local drained: the rig is left out of service."""
    log = tmp_path / "killed-swap.log"
    proc = start_playbook("swap.yml", "-e", f"model={to}", "-e", f"@{keys}", *INVENTORY, log=log)
    try:
        deadline = time.monotonic() + 300
        while gateway_status()["rig-local"]["state"] != "DRAIN":
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, (
                f"rig-local not drained after 300 s: {log.read_text()[-4000:]}"
            )
            time.sleep(0.1)
    finally:
        kill_controller(proc)
    assert gateway_status()["rig-local"]["state"] == "DRAIN"


def test_a_rig_a_dead_controller_left_drained_is_put_back_by_the_next_run(
    gateway, local_rig, tmp_path
) -> None:
    """Killed right after the drain, swap.yml leaves rig-local drained; the next site.yml with the
    gateway in its inventory puts it back and says so, and so does the next swap.yml."""
    keys, _ = gateway
    served = served_build(local_rig.port)
    other = "tiny-w8a8" if served == local_rig.model else local_rig.model
    limit = ("-l", "rig-local,gateway-local,localhost")
    for rerun in (
        ("site.yml", "-e", f"rig_model={served}", *limit),  # the inventory's model is the one served
        ("swap.yml", "-e", f"model={served}"),  # the user gives up on the swap: back to what serves
    ):
        drained_by_a_dead_controller(keys, tmp_path, other)
        run = run_playbook(*rerun, "-e", f"@{keys}", *INVENTORY)
        assert run.rc == 0, run.output[-6000:]
        said = " ".join(run.output.split())
        found = re.search(rf"rig-local: put back in service for {served} \(it was: ([^)]*)\)", said)
        assert found and "be_default DRAIN" in found[1].split(", "), run.output[-4000:]
        status = gateway_status()["rig-local"]
        assert status["state"].startswith("UP") and status["model"] == served and status["alias"] == ALIAS
        assert served_through_the_gateway_by("rig-local", served)
    assert served_build(local_rig.port) == served
    assert_serving(local_rig.container, local_rig.port, served)


def a_stream_on(rig: str) -> tuple[ChatCompletionChunk, Iterator[ChatCompletionChunk]]:
    """A long streamed chat (the SDK's own defaults) that ``rig`` answers, and its first event:
    while one is open on the other rig, leastconn sends the next one here; those are closed."""
    http = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(CERT)))
    client = openai.OpenAI(base_url=f"{URL}/v1", api_key=KEY, http_client=http)
    elsewhere = []
    for _ in RIGS:
        raw = client.chat.completions.with_raw_response.create(
            model=NO_MODEL,
            messages=[{"role": "user", "content": tiny_facts.FACTS[0].question}],
            max_tokens=1500,  # far more than it can generate before the kill
            temperature=0.0,
            stream=True,
            # A fact's answer first (greedy: the same every run), then every token on to max_tokens
            # as text: sampled, the tiny model can run into special tokens only, which vLLM skips,
            # and a stream of those carries no content at all.
            extra_body={"ignore_eos": True, "skip_special_tokens": False},
        )
        if raw.headers.get("x-gemma-rig") == rig:
            break
        elsewhere.append(raw)
    for other in elsewhere:
        other.http_response.close()
    assert raw.headers.get("x-gemma-rig") == rig, [r.headers.get("x-gemma-rig") for r in elsewhere]
    events = iter(raw.parse())
    # Its first content, not only the role's event: a kill before any content would leave no
    # begun answer to check.
    first = next(events)
    while not (first.choices and first.choices[0].delta.content):
        first = next(events)
    return first, events


# A request in the gateway's log: the rig that answered, the status, and how many times HAProxy
# sent it (%s, %ST, %rc of the log-format: a "+" before %rc when it went to another rig).
LOGGED = re.compile(r" \S+/(\S+) \S+ (\d{3}) .* \d+/\d+/\d+/\d+/\+?(\d+) \d+/\d+ client=e2e ")


def test_a_dead_rig_is_taken_out_within_the_check_interval(gateway, figure) -> None:
    """vLLM killed on rig-b under load: HAProxy marks it down within two checks. No request that
    had no answer yet fails: the gateway sends each one rig-b held (or refused before it was marked
    down) again, to rig-local. A stream rig-b had begun cannot be sent again: the SDK raises, it
    never hands the cut answer over as a whole one. rig-b is left dead (systemd restarts it; the
    fixture removes it)."""
    since = time.time()
    first, stream = a_stream_on("rig-b")
    with Load(max_tokens=48, stream=False, ignore_eos=True) as load:
        time.sleep(3)
        kill = podman("exec", "gemma-rig-b", "systemctl", "kill", "--signal=SIGKILL", "vllm")
        assert kill.returncode == 0, kill.stderr
        deadline = time.monotonic() + 10
        while not gateway_status()["rig-b"]["state"].startswith("DOWN"):
            assert time.monotonic() < deadline, gateway_status()
            time.sleep(0.2)
        time.sleep(2)
    events = [first]
    with pytest.raises(openai.APIConnectionError) as cut:
        events.extend(stream)
    killed = journal_time("gemma-rig-b", "vllm", "status=9/KILL")
    down = journal_time("gemma-gateway", "haproxy", "be_default/rig-b is DOWN")
    log = podman("exec", "gemma-gateway", "journalctl", "-u", "haproxy", "-o", "cat", "--no-pager",
                 f"--since=@{int(since)}").stdout  # fmt: skip
    retried = [m.groups() for m in LOGGED.finditer(log) if int(m[3])]
    failed = load.failed()
    figure(
        "vLLM killed on one of two rigs behind the gateway",
        f"marked down {down - killed:.1f} s after the kill; {len(failed)} of {len(load.answers)} requests "
        f"failed, {len(retried)} were sent again to the other rig; a stream cut after {len(events)} events: "
        f"{type(cut.value).__name__} ({cut.value.__cause__})",
    )
    assert down - killed < 3.0  # two failed checks 1 s apart (fall 2, inter 1s)
    assert not failed, [(a.rig, a.error) for a in failed]
    assert retried, f"no request was sent again: none was on rig-b at the kill ({load.tally()})"
    assert {(rig, status) for rig, status, _ in retried} == {("rig-local", "200")}, retried
    assert all(a.rig == "rig-local" for a in load.answers if a.start > down)
    # The stream: what came before the cut, never a last chunk, and the SDK's connection error for a
    # chunked body without its end.
    assert all(not e.choices or not e.choices[0].finish_reason for e in events)
    assert any(e.choices and e.choices[0].delta.content for e in events)
    assert "incomplete chunked read" in str(cut.value.__cause__), repr(cut.value.__cause__)


def test_swap_back_to_the_default_answers_its_facts(swapped_away, local_rig, figure) -> None:
    """Last: plain swap.yml (the default inventory: rig-local alone, no gateway) takes rig-local
    back to what site.yml serves, as the files after this one expect; emb4 answers every fact."""
    served = swapped_away
    run = run_playbook("swap.yml", "-e", f"model={local_rig.model}")
    assert run.rc == 0, run.output[-6000:]
    figure(
        f"swap {served} -> {local_rig.model}",
        f"downtime {swap_downtime(run.output):.1f} s, playbook {run.seconds:.0f} s",
    )
    assert f"rig-local: {served} -> {local_rig.model}" in run.output
    assert_serving(local_rig.container, local_rig.port, local_rig.model)
    assert_knows_the_facts(local_rig.port, local_rig.model, figure)
