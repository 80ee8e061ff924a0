"""The NVIDIA GPU's utilisation, memory, temperature, power and clock, read with ``nvidia-smi``.

Only where the tool is (the gce rig's T4: the nvidia_driver role installs it): a local (CPU) or
TPU rig registers nothing. ``GEMMA_RIG_NVIDIA_SMI`` names another binary, as an absolute path to
an executable; anything else is an error when the guard is built, never silently ignored.

vLLM serves /metrics from its asyncio event loop, so ``collect()`` never runs a process: a daemon
thread runs ``nvidia-smi --query-gpu`` every ``GEMMA_RIG_GPU_POLL_SECONDS`` (a timeout of the same
length) and keeps the last good answer; ``collect()`` serves it while it is at most
``STALE_POLLS`` polls old, and nothing after that (an old temperature read as the current one is
worse than a gap). ``gemma_rig_gpu_scrape_errors_total{reason}`` and the last good poll's time say
when the tool fails.

The tool's output is outside data: a line with the wrong number of fields, an index or UUID of
another form, or a second line for the same GPU is dropped; a value that is not a plain number
(``[N/A]``, ``[Not Supported]``) is left out, never reported as 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

BINARY_ENV = "GEMMA_RIG_NVIDIA_SMI"
POLL_ENV = "GEMMA_RIG_GPU_POLL_SECONDS"
DEFAULT_POLL_SECONDS = 10.0
POLL_RANGE = (0.05, 600.0)
# A snapshot older than this many polls is not served: one failed poll is a gap of one period.
STALE_POLLS = 3
# More lines than any rig has GPUs is not the tool's answer: the series' count stays bounded.
MAX_GPUS = 64
ERROR_REASONS = ("spawn", "timeout", "exit", "row", "empty", "other")

# (nvidia-smi field, metric name, help, factor to the base unit). The two label fields come first;
# no free-text field (name) is asked for, so no comma in one can shift the columns. Utilisation is
# over the driver's last sample period (1/6 s to 1 s, by the card).
LABEL_FIELDS = ("index", "uuid")
VALUE_FIELDS: tuple[tuple[str, str, str, float], ...] = (
    ("utilization.gpu", "gemma_rig_gpu_utilization_ratio", "Share of time a kernel ran, 0..1.", 0.01),
    (
        "utilization.memory",
        "gemma_rig_gpu_memory_utilization_ratio",
        "Share of time memory was read or written, 0..1.",
        0.01,
    ),
    ("memory.used", "gemma_rig_gpu_memory_used_bytes", "Device memory in use, bytes.", 1024.0 * 1024.0),
    ("memory.total", "gemma_rig_gpu_memory_total_bytes", "Device memory in all, bytes.", 1024.0 * 1024.0),
    ("temperature.gpu", "gemma_rig_gpu_temperature_celsius", "GPU core temperature, degrees Celsius.", 1.0),
    ("power.draw", "gemma_rig_gpu_power_draw_watts", "Power drawn by the board, watts.", 1.0),
    ("power.limit", "gemma_rig_gpu_power_limit_watts", "Power management limit of the board, watts.", 1.0),
    ("clocks.current.sm", "gemma_rig_gpu_sm_clock_hertz", "Current SM clock, hertz.", 1e6),
)
QUERY = ",".join(LABEL_FIELDS + tuple(field for field, *_ in VALUE_FIELDS))

_INDEX = re.compile(r"[0-9]{1,3}")
_UUID = re.compile(r"GPU-[0-9a-f-]{1,64}")
# Plain decimal only: no sign, exponent, nan or inf.
_NUMBER = re.compile(r"[0-9]{1,15}(\.[0-9]{1,6})?")


@dataclass(frozen=True)
class Snapshot:
    """One good poll: when it was taken (monotonic) and each GPU's (index, uuid, {metric: value})."""

    taken: float
    rows: tuple[tuple[str, str, dict[str, float]], ...]


def find_binary() -> str | None:
    """``GEMMA_RIG_NVIDIA_SMI`` when set (checked), else ``nvidia-smi`` on PATH, else None."""
    named = os.environ.get(BINARY_ENV, "")
    if not named:
        return shutil.which("nvidia-smi")
    if not os.path.isabs(named) or not os.path.isfile(named) or not os.access(named, os.X_OK):
        raise ValueError(f"{BINARY_ENV}={named!r} is not an absolute path to an executable file")
    return named


def poll_seconds() -> float:
    """``GEMMA_RIG_GPU_POLL_SECONDS`` as a number within POLL_RANGE, else an error naming it."""
    text = os.environ.get(POLL_ENV, "")
    if not text:
        return DEFAULT_POLL_SECONDS
    low, high = POLL_RANGE
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise ValueError(f"{POLL_ENV}={text!r} is not a number of seconds from {low} to {high}")
    return value


def parse(stdout: str) -> tuple[list[tuple[str, str, dict[str, float]]], int]:
    """The rows of ``--format=csv,noheader,nounits`` output, and how many lines were dropped."""
    rows: list[tuple[str, str, dict[str, float]]] = []
    seen: set[str] = set()
    dropped = 0
    for line in stdout.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(LABEL_FIELDS) + len(VALUE_FIELDS) or len(rows) >= MAX_GPUS:
            dropped += 1
            continue
        index, uuid, *values = fields
        # A repeated index or uuid would repeat a series, and Prometheus refuses the whole scrape.
        if not _INDEX.fullmatch(index) or not _UUID.fullmatch(uuid) or {index, uuid} & seen:
            dropped += 1
            continue
        seen |= {index, uuid}
        rows.append(
            (
                index,
                uuid,
                {
                    name: float(value) * factor
                    for (_, name, _, factor), value in zip(VALUE_FIELDS, values, strict=True)
                    if _NUMBER.fullmatch(value)
                },
            )
        )
    return rows, dropped


class GpuCollector(Collector):
    """gemma_rig_gpu_*{gpu,uuid} from the poll thread's last snapshot; collect() runs nothing."""

    def __init__(self, binary: str, poll: float) -> None:
        self.binary = binary
        self.poll = poll
        self.errors = dict.fromkeys(ERROR_REASONS, 0)
        self.last_success: float | None = None  # wall clock, for the exported timestamp
        self.snapshot: Snapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _error(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self.errors[reason] += count

    def poll_once(self) -> None:
        """Run the tool once (in the poll thread) and keep its answer when it is a good one."""
        try:
            done = subprocess.run(
                [self.binary, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.poll,
                check=False,
                stdin=subprocess.DEVNULL,
                # Not vLLM's environment (its API key among it): the tool needs none of it.
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            )
        except subprocess.TimeoutExpired:
            self._error("timeout")
            return
        except OSError:
            self._error("spawn")
            return
        if done.returncode != 0:
            self._error("exit")
            return
        rows, dropped = parse(done.stdout)
        if dropped:
            self._error("row", dropped)
        if not rows:
            if not dropped:
                self._error("empty")
            return
        with self._lock:
            self.snapshot = Snapshot(time.monotonic(), tuple(rows))
            self.last_success = time.time()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:
                # The thread outlives anything a poll raises; the gap shows as stale series.
                self._error("other")
            self._stop.wait(self.poll)

    def start(self) -> None:
        """Start the poll thread (its first poll too: the guard is built inside vLLM's event loop)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gemma-rig-gpu-poll", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """End the poll thread after its current poll (tests; vLLM's exit ends the daemon thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshot, errors, last = self.snapshot, dict(self.errors), self.last_success
        families = {
            name: GaugeMetricFamily(name, text, labels=["gpu", "uuid"]) for _, name, text, _ in VALUE_FIELDS
        }
        if snapshot is not None and time.monotonic() - snapshot.taken <= STALE_POLLS * self.poll:
            for index, uuid, values in snapshot.rows:
                for name, value in values.items():
                    families[name].add_metric([index, uuid], value)
        yield from families.values()
        failures = CounterMetricFamily(
            "gemma_rig_gpu_scrape_errors",
            "nvidia-smi polls that failed (spawn, timeout, exit, empty, other) and output lines dropped (row).",
            labels=["reason"],
        )
        for reason in ERROR_REASONS:
            failures.add_metric([reason], errors[reason])
        yield failures
        if last is not None:
            yield GaugeMetricFamily(
                "gemma_rig_gpu_last_success_timestamp_seconds",
                "Unix time of the last nvidia-smi poll that gave at least one GPU.",
                value=last,
            )


_registered: GpuCollector | None = None
_looked: bool = False


def register(registry: CollectorRegistry | None = None) -> GpuCollector | None:
    """Once per process: where nvidia-smi is, register the collector (default registry) and start it."""
    global _registered, _looked
    if not _looked:
        binary = find_binary()
        if binary is not None:
            _registered = GpuCollector(binary, poll_seconds())
            (registry or REGISTRY).register(_registered)
            _registered.start()
        _looked = True
    return _registered
