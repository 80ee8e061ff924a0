"""The real Prometheus (Debian's 2.42 binaries, unpacked by scripts/setup.sh into build/prometheus)
over a TSDB backfilled with made-up samples of the fleet's metrics: vLLM's, the gateway's per-client
counters and the guard's per-client tokens. Used by the page's test and gateway-ctl metrics' tests.

The samples end at "now": the page and gateway-ctl ask instant queries at the time they run, and
Prometheus looks back 5 minutes at most for a sample, so the data must reach the present.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "build/prometheus/usr/bin"
PROMETHEUS = BIN / "prometheus"
PROMTOOL = BIN / "promtool"
CONSOLES = ROOT / "roles/monitoring/files/consoles"
LIBRARIES = ROOT / "roles/monitoring/files/console_libraries"
RIGS = ("rig-a", "rig-b")
CLIENTS = ("alice", "bob")
MODEL = "gemma-4-e4b"
STEP_S = 15
TTFT_BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "+Inf")


def require_binaries() -> None:
    """Skip without the unpacked binaries; in CI (CI=true) their absence is a failure."""
    missing = [str(p) for p in (PROMETHEUS, PROMTOOL) if not os.access(p, os.X_OK)]
    if not missing:
        return
    why = f"{', '.join(missing)} missing: run scripts/setup.sh (it unpacks Debian's prometheus)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(why)
    pytest.skip(why)


def _escaped(value: str) -> str:
    """A label value as OpenMetrics text carries it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _line(name: str, labels: dict[str, str], value: float, ts: float) -> str:
    pairs = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())
    return f"{name}{{{pairs}}} {value:.6f} {ts:.3f}"


def fleet_openmetrics(
    end: float,
    minutes: int = 20,
    rigs: tuple[str, ...] = RIGS,
    clients: tuple[str, ...] = CLIENTS,
    idle: tuple[str, ...] = (),
    gpu_rigs: tuple[str, ...] = ("rig-a",),
) -> str:
    """OpenMetrics text: the rigs and clients (the guard's tokens), a sample every STEP_S
    seconds up to ``end``. The gateway's counters are alice's and bob's.

    Counters grow at a steady rate per rig (rig-b at twice rig-a's), so rates are known: rig-a
    makes 40 generation tokens/s and 100 prompt tokens/s. rig-b aborted requests; bob got 503s.
    The ``idle`` rigs (of ``rigs``) served nothing: their counters stay at 0. The ``gpu_rigs`` have
    a T4 the guard reads with nvidia-smi: 50 % busy, 12 of 15 GiB, 60 °C, 50 W."""
    times = [end - STEP_S * i for i in range(minutes * 60 // STEP_S, -1, -1)]
    start = times[0]
    out: list[str] = []
    for i, rig in enumerate(rigs, start=1):
        n = 0 if rig in idle else i
        base = {"job": "vllm", "rig": rig, "model_name": MODEL, "engine": "0"}
        series: list[tuple[str, dict[str, str], float, float]] = [
            # (name, extra labels, value at start, growth per second)
            ("vllm:generation_tokens_total", {}, 0, 40 * n),
            ("vllm:prompt_tokens_total", {}, 0, 100 * n),
            ("vllm:num_requests_running", {}, 3 * n, 0),
            ("vllm:num_requests_waiting", {}, max(n - 1, 0), 0),
            ("vllm:kv_cache_usage_perc", {}, 0.25 * n, 0),
            ("vllm:request_success_total", {"finished_reason": "stop"}, 0, 1 * n),
            ("vllm:request_success_total", {"finished_reason": "abort"}, 0, 0.1 * max(n - 1, 0)),
            ("vllm:request_success_total", {"finished_reason": "error"}, 0, 0),
            ("vllm:time_to_first_token_seconds_count", {}, 0, 1 * n),
            ("vllm:time_to_first_token_seconds_sum", {}, 0, 0.3 * n),
        ]
        # TTFT: of each second's n requests, a share under each bound (cumulative).
        for le, share in zip(TTFT_BUCKETS, (0.0, 0.2, 0.6, 0.9, 0.97, 1.0, 1.0), strict=True):
            series.append(("vllm:time_to_first_token_seconds_bucket", {"le": le}, 0, share * n))
        for client in clients:
            for kind, rate in (("prompt", 50), ("completion", 20)):
                series.append(
                    ("gemma_rig_client_tokens_total", {"client": client, "kind": kind}, 0, rate * n)
                )
        if rig in gpu_rigs:
            card = {"gpu": "0", "uuid": f"GPU-{i:08x}-0b7d-4e3a-9c61-2f8d7a4b1e90"}
            for name, value in (
                ("gemma_rig_gpu_utilization_ratio", 0.5),
                ("gemma_rig_gpu_memory_used_bytes", 12 * 2**30),
                ("gemma_rig_gpu_memory_total_bytes", 15 * 2**30),
                ("gemma_rig_gpu_temperature_celsius", 60),
                ("gemma_rig_gpu_power_draw_watts", 50),
            ):
                series.append((name, card, value, 0))
        for name, extra, first, per_s in series:
            labels = {**base, **extra}
            out += [_line(name, labels, first + per_s * (t - start), t) for t in times]
    for client, codes in (("alice", {"200": 2.0, "404": 0.1}), ("bob", {"200": 1.0, "503": 0.5})):
        for code, per_s in codes.items():
            labels = {"job": "gateway_usage", "client": client, "code": code}
            out += [
                _line("gemma_gateway_client_requests_total", labels, per_s * (t - start), t) for t in times
            ]
    return "\n".join(out) + "\n# EOF\n"


def backfill(tsdb: Path, text: str, scratch: Path) -> None:
    """Write ``text`` (OpenMetrics) into the TSDB directory ``tsdb`` with promtool."""
    tsdb.mkdir(parents=True, exist_ok=True)
    source = scratch / "samples.om"
    source.write_text(text)
    done = subprocess.run(
        [str(PROMTOOL), "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {done.stderr.strip()[-2000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(proc: subprocess.Popen, url: str, log: Path, deadline_s: float) -> None:
    """Wait until ``url``/-/ready answers 200 (Prometheus's and Alertmanager's readiness); raise
    with the end of ``log`` (named after the server) if the process exits first, or once
    ``deadline_s`` has passed."""
    name = log.stem
    deadline = time.monotonic() + deadline_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not ready at {url} after {deadline_s:.0f} s")
        time.sleep(0.1)


@contextmanager
def prometheus(tsdb: Path, scratch: Path, deadline_s: float = 120) -> Iterator[str]:
    """Prometheus on a free loopback port over ``tsdb``, with the project's console templates;
    yields its base URL once /-/ready answers 200."""
    tsdb.mkdir(parents=True, exist_ok=True)
    config = scratch / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")  # scrapes nothing: the data is backfilled
    port = free_port()
    log = (scratch / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.console.templates={CONSOLES}",
            f"--web.console.libraries={LIBRARIES}",
            "--storage.tsdb.retention.time=1d",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, scratch / "prometheus.log", deadline_s)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
