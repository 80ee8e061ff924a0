"""The fleet seen by its monitoring: Prometheus on the gateway host holds both rigs and the gateway,
counts each client exactly, the page shows it in a real browser, and a stopped rig pages someone.

The gateway (with Prometheus, Alertmanager and the node exporter on its host) is test_25's, handed
over in the state test_25 leaves it (conftest.gateway); this file takes it down at its end. Every
container shares the controller's network, so Prometheus, HAProxy's metrics frontend and the rigs'
/metrics are read here on 127.0.0.1, and Alertmanager posts to conftest's receiver on the same
loopback.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import GATEWAY_CLIENTS, AlertReceiver, gateway_down, runs_later
from tests.e2e.rig import assert_serving, podman, wait_listed

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # rig-local serving tiny-emb4, closed (rig-b serves what test_25 left: tiny-w8a8)

PROMETHEUS = "http://127.0.0.1:9090"  # monitoring_prometheus_port
ALERTMANAGER = "http://127.0.0.1:9093"  # monitoring_alertmanager_port
USAGE = "http://127.0.0.1:8404/usage"  # gateway_metrics_port: the per-client counters
GATEWAY = "https://127.0.0.1:8443"
CERT = ROOT / "build" / "gateway" / "gateway-local.crt"
RIGS = {"rig-local": ("gemma-rig", 8000), "rig-b": ("gemma-rig-b", 8001)}
MAX_TOKENS = 6  # with ignore_eos: every answer has exactly this many completion tokens
SCRAPE_SECONDS = 5  # the local profile's scrape and evaluation interval
RIG_DOWN_FOR = 60  # GemmaRigDown's `for`
GROUP_WAIT = 5  # the local profile's Alertmanager group_wait
NO_ACCELERATOR_PANELS = {"gpu"}  # fed by nvidia-smi on a T4 rig: a local rig has none
SAMPLE = re.compile(
    r'^gemma_gateway_client_requests_total\{client="([^"]*)",code="(\d{3})"\} ([0-9.e+]+)$', re.M
)


@pytest.fixture(scope="module", autouse=True)
def hand_back(gateway, local_rig, request: pytest.FixtureRequest):
    """This file is the gateway's last user: it goes when the file ends, and rig-b with it, unless
    test_98 runs later: then rig-b is only stopped, for test_98 to start through the fake API."""
    yield
    gateway_down(local_rig, keep_rig_b=runs_later(request, "test_98_wake"))


def prom(query: str) -> list[dict]:
    """An instant query's result vector."""
    answer = httpx.get(f"{PROMETHEUS}/api/v1/query", params={"query": query}, timeout=30).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def by(result: list[dict], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1]) for r in result}


def usage_now() -> Counter[tuple[str, str]]:
    """The gateway's per-client counters, read from its metrics frontend directly."""
    text = httpx.get(USAGE, timeout=10).text
    return Counter({(c, code): int(float(v)) for c, code, v in SAMPLE.findall(text)})


def tokens_now() -> Counter[tuple[str, str]]:
    """gemma_rig_client_tokens_total summed over both rigs, read from each rig's own /metrics."""
    total: Counter[tuple[str, str]] = Counter()
    pattern = re.compile(
        r'^gemma_rig_client_tokens_total\{client="([^"]*)",kind="(\w+)"\} ([0-9.e+]+)$', re.M
    )
    for _, port in RIGS.values():
        for client, kind, value in pattern.findall(
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        ):
            total[(client, kind)] += int(float(value))
    return total


def scraped_after(job: str, moment: float) -> None:
    """Wait until Prometheus has scraped ``job`` after ``moment`` (time.time())."""
    deadline = time.monotonic() + 6 * SCRAPE_SECONDS
    while time.monotonic() < deadline:
        if all(float(r["value"][1]) > moment for r in prom(f'timestamp(up{{job="{job}"}})')):
            return
        time.sleep(1)
    pytest.fail(f"Prometheus did not scrape {job} within {6 * SCRAPE_SECONDS} s")


def client(key: str) -> openai.OpenAI:
    http = httpx.Client(verify=ssl.create_default_context(cafile=str(CERT)), timeout=120)
    return openai.OpenAI(base_url=f"{GATEWAY}/v1", api_key=key, max_retries=0, http_client=http)


def test_prometheus_counts_each_client_exactly(gateway) -> None:
    """A short load from two clients (plain and streamed answers) and a stranger: the gateway's
    per-client requests by status code, and the rigs' per-client tokens, match the load's own count
    exactly, both read directly and in Prometheus after its next scrape."""
    before_requests, before_tokens = usage_now(), tokens_now()
    sent: Counter[tuple[str, str]] = Counter()
    asked: Counter[str] = Counter()
    prompt_tokens = 0
    messages = [{"role": "user", "content": "Say hello."}]
    for name, stream, count in (("e2e", False, 6), ("e2e-b", True, 4), ("e2e", True, 2), ("e2e-b", False, 3)):
        sdk = client(GATEWAY_CLIENTS[name])
        for _ in range(count):
            kwargs = dict(model="", messages=messages, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
            if stream:
                chunks = list(sdk.chat.completions.create(stream=True, **kwargs))
                assert chunks and all(c.choices for c in chunks), (
                    "the client got a usage chunk it never asked for"
                )
            else:
                answer = sdk.chat.completions.create(**kwargs)
                assert answer.usage.completion_tokens == MAX_TOKENS
                prompt_tokens = answer.usage.prompt_tokens  # the same prompt every time
            sent[(name, "200")] += 1
            asked[name] += 1
    stranger = client("sk-not-a-client-0123456789")
    for _ in range(3):
        with pytest.raises(openai.AuthenticationError):
            stranger.chat.completions.create(model="", messages=messages, max_tokens=1)
        sent[("-", "401")] += 1
    tokens = Counter({(n, "completion"): c * MAX_TOKENS for n, c in asked.items()})
    tokens.update({(n, "prompt"): c * prompt_tokens for n, c in asked.items()})
    done = time.time()

    assert usage_now() - before_requests == sent
    assert tokens_now() - before_tokens == tokens
    scraped_after("gateway_usage", done)
    scraped_after("vllm", done)
    in_prometheus = by(prom("gemma_gateway_client_requests_total"), "client", "code")
    for (name, code), count in sent.items():
        assert in_prometheus[(name, code)] == before_requests[(name, code)] + count
    rig_tokens = by(prom("sum by (client, kind) (gemma_rig_client_tokens_total)"), "client", "kind")
    for (name, kind), count in tokens.items():
        assert rig_tokens[(name, kind)] == before_tokens[(name, kind)] + count


def test_prometheus_holds_both_rigs_the_gateway_and_the_host(gateway) -> None:
    up = by(prom("up"), "job", "rig")
    assert up[("vllm", "rig-local")] == 1 and up[("vllm", "rig-b")] == 1, up
    for job in ("haproxy", "gateway_usage", "node", "prometheus", "alertmanager"):
        assert up[(job, "")] == 1, (job, up)
    # Each rig's own series, whatever it has served since its last start (a swap restarts the count).
    for series in ("vllm:generation_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_running"):
        assert {r for (r,) in by(prom(series), "rig")} == {"rig-local", "rig-b"}, series
    assert prom("haproxy_backend_http_requests_total"), "no HAProxy backend series"


def test_the_page_shows_every_panel_with_data(gateway, tmp_path: Path, figure) -> None:
    """The fleet page in a real headless Chromium: the screenshot is taken and every panel has a
    number in it (tests/unit/test_fleet_page.py shows the same page empty says so), but the GPU
    panel: local rigs have no accelerator, and the page says it has no data rather than a zero."""
    page = f"{PROMETHEUS}/consoles/gemma-rig.html"
    shot = ROOT / "build" / "fleet-page-e2e.png"
    browser = ["chromium-headless-shell", "--no-sandbox", "--disable-gpu", "--window-size=1400,1800"]
    started = time.monotonic()
    subprocess.run([*browser, f"--screenshot={shot}", page], check=True, capture_output=True, timeout=120)
    dom = subprocess.run(
        [*browser, "--dump-dom", page], check=True, capture_output=True, text=True, timeout=120
    )
    figure(
        "the fleet page: screenshot and DOM in headless Chromium",
        f"{time.monotonic() - started:.1f} s, {shot}",
    )
    assert shot.stat().st_size > 20_000
    panels = re.findall(r'<[^>]+data-panel="([^"]+)"', dom.stdout)
    assert panels, dom.stdout[:2000]
    assert set(panels) >= NO_ACCELERATOR_PANELS, panels
    for panel in set(panels):
        section = dom.stdout.split(f'data-panel="{panel}"', 1)[1].split("data-panel=", 1)[0]
        if panel in NO_ACCELERATOR_PANELS:
            assert 'data-empty="true"' in section and "data-value=" not in section, section[:600]
        else:
            assert re.search(r'data-value="[-+0-9.eE]+"', section), f"panel {panel} has no data"


def test_the_metrics_view_from_the_gateway_host(gateway) -> None:
    """`gateway-ctl metrics`, which status.yml and the MCP server render: both rigs, with data."""
    done = podman(
        "exec", "gemma-gateway", "/usr/local/libexec/gemma-rig/gateway-ctl", "metrics", "--minutes", "10"
    )
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    text = json.dumps(view)
    assert "rig-local" in text and "rig-b" in text, text[:2000]


def started(alert: dict) -> float:
    """When an alert Alertmanager sent began firing (its startsAt), as time.time()."""
    return datetime.fromisoformat(alert["startsAt"]).timestamp()


def test_each_swap_silenced_its_rig_and_ended_the_silence(gateway) -> None:
    """test_25's swaps through the gateway silenced each rig's alerts at the gateway host's
    Alertmanager while it swapped, matched exactly by its name, and ended each silence after the
    swap (roles/swap/tasks/silence.yml; a real Alertmanager's suppression is test_swap_silence's)."""
    silences = httpx.get(f"{ALERTMANAGER}/api/v2/silences", timeout=10).json()
    swaps = [s for s in silences if s["createdBy"] == "gemma-rig swap.yml"]
    assert all(
        s["matchers"]
        == [{"name": "rig", "value": s["matchers"][0]["value"], "isRegex": False, "isEqual": True}]
        for s in swaps
    ), swaps
    rigs = {s["matchers"][0]["value"] for s in swaps}
    ended = {
        s["matchers"][0]["value"] for s in swaps if s["comment"].endswith("ended, grace for the next scrape")
    }
    assert rigs == ended == set(RIGS), swaps


def test_a_stopped_rig_pages_someone(gateway, alert_receiver: AlertReceiver, figure) -> None:
    """vLLM stopped on rig-b: GemmaRigDown reaches the webhook within its `for`, two scrape and
    evaluation intervals and Alertmanager's group wait; rig-b is started again and serves."""
    container, port = RIGS["rig-b"]
    assert not alert_receiver.firing("GemmaRigDown", rig="rig-b")
    stopped, stopped_at = time.monotonic(), time.time()
    assert podman("exec", container, "systemctl", "stop", "vllm").returncode == 0
    try:
        within = RIG_DOWN_FOR + 3 * SCRAPE_SECONDS + GROUP_WAIT + 30
        fired = alert_receiver.wait_firing("GemmaRigDown", within, rig="rig-b")
        figure(
            "rig-b stopped -> GemmaRigDown at the webhook",
            f"{time.monotonic() - stopped:.0f} s (bound {within} s)",
        )
        assert fired, f"no GemmaRigDown for rig-b within {within} s; received {alert_receiver.received[-3:]}"
        # rig-local pages only if it was down itself (its swaps are silenced, test_25's kills are
        # not): none began with rig-b's stop.
        began = [
            a for a in alert_receiver.firing("GemmaRigDown", rig="rig-local") if started(a) >= stopped_at
        ]
        assert not began, began
    finally:
        assert podman("exec", container, "systemctl", "start", "vllm").returncode == 0
    assert_serving(container, port, wait_listed(port))
