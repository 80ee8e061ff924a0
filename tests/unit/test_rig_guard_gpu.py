"""The guard's GPU series (gpu.py), read through the real subprocess path from a fake ``nvidia-smi``.

The fake is a shell script written here: it logs each run's arguments and environment, then prints
what the test put in its ``out`` file, the way the real tool prints ``--format=csv,noheader,nounits``
(fields joined by ", ", ``[N/A]`` and ``[Not Supported]`` kept even with units off), and exits with
the code in ``rc``; with a ``hang`` file it sleeps past any timeout instead. What a scrape would see
is the text prometheus_client renders for a fresh registry, parsed back.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from tests.unit.test_rig_guard import GUARD_SRC, _guard_env

if str(GUARD_SRC) not in sys.path:
    sys.path.insert(0, str(GUARD_SRC))

from gemma_rig_guard import ServedPathsGuard, gpu

UUID0 = "GPU-5c2a9f1e-0b7d-4e3a-9c61-2f8d7a4b1e90"
UUID1 = "GPU-a81f3c07-6d2e-41b9-8e5f-0c9b3d7a2f14"
# A T4 as the real tool answers the collector's query: index, uuid, then the values in QUERY's order.
T4_0 = f"0, {UUID0}, 87, 41, 14300, 15360, 63, 68.42, 70.00, 1590"
T4_1 = f"1, {UUID1}, 0, 0, 3, 15360, 38, 9.81, 70.00, 300"
MIB = 1024 * 1024


class FakeSmi:
    """An executable ``nvidia-smi`` in its own directory, steered through files beside it."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.dir = directory
        self.path = directory / "nvidia-smi"
        self.path.write_text(
            "#!/bin/sh\n"
            'd="${0%/*}"\n'
            'printf "%s\\n" "$*" >>"$d/runs"\n'
            'env >>"$d/env"\n'
            'if [ -e "$d/hang" ]; then exec sleep 30; fi\n'
            'cat "$d/out"\n'
            'exit "$(cat "$d/rc")"\n'
        )
        self.path.chmod(0o755)
        self.answer([T4_0])

    def answer(self, lines: list[str], rc: int = 0) -> None:
        (self.dir / "out").write_text("".join(line + "\n" for line in lines))
        (self.dir / "rc").write_text(f"{rc}\n")

    def hang(self, on: bool) -> None:
        flag = self.dir / "hang"
        if on:
            flag.touch()
        else:
            flag.unlink()

    def runs(self) -> list[str]:
        log = self.dir / "runs"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def smi(tmp_path: Path) -> FakeSmi:
    return FakeSmi(tmp_path / "bin")


@pytest.fixture
def collectors() -> Iterator[Callable[..., gpu.GpuCollector]]:
    """GpuCollectors on the fake, their poll threads stopped at the end."""
    made: list[gpu.GpuCollector] = []

    def make(smi: FakeSmi, poll: float = 5.0) -> gpu.GpuCollector:
        made.append(gpu.GpuCollector(str(smi.path), poll))
        return made[-1]

    yield make
    for collector in made:
        collector.stop(timeout=5)


def scrape(collector: gpu.GpuCollector) -> dict[tuple[str, str], float]:
    """What /metrics would serve of the collector: {(sample name, gpu label or reason): value}."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, s.labels.get("gpu", s.labels.get("reason", ""))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def gpu_series(collector: gpu.GpuCollector) -> dict[tuple[str, str], float]:
    return {k: v for k, v in scrape(collector).items() if k[1].isdigit()}


def errors(collector: gpu.GpuCollector, reason: str) -> float:
    return scrape(collector)[("gemma_rig_gpu_scrape_errors_total", reason)]


def wait_for(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


def test_two_gpus_in_base_units(smi: FakeSmi, collectors, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "sk-not-for-the-tool")
    smi.answer([T4_0, T4_1])
    collector = collectors(smi)
    collector.poll_once()
    series = gpu_series(collector)
    assert series[("gemma_rig_gpu_utilization_ratio", "0")] == pytest.approx(0.87)
    assert series[("gemma_rig_gpu_memory_utilization_ratio", "0")] == pytest.approx(0.41)
    assert series[("gemma_rig_gpu_memory_used_bytes", "0")] == 14300 * MIB
    assert series[("gemma_rig_gpu_memory_total_bytes", "1")] == 15360 * MIB
    assert series[("gemma_rig_gpu_temperature_celsius", "0")] == 63
    assert series[("gemma_rig_gpu_power_draw_watts", "0")] == pytest.approx(68.42)
    assert series[("gemma_rig_gpu_power_limit_watts", "1")] == 70
    assert series[("gemma_rig_gpu_sm_clock_hertz", "1")] == 300e6
    assert len(series) == 2 * len(gpu.VALUE_FIELDS)
    text = generate_latest(_registry(collector)).decode()
    assert f'gemma_rig_gpu_temperature_celsius{{gpu="1",uuid="{UUID1}"}} 38.0' in text
    assert 'gemma_rig_gpu_scrape_errors_total{reason="timeout"} 0.0' in text
    assert "gemma_rig_gpu_last_success_timestamp_seconds " in text
    # The query the tool got, and none of vLLM's environment (its key).
    assert smi.runs() == [
        "--query-gpu=index,uuid,utilization.gpu,utilization.memory,memory.used,memory.total,"
        "temperature.gpu,power.draw,power.limit,clocks.current.sm --format=csv,noheader,nounits"
    ]
    assert "sk-not-for-the-tool" not in (smi.dir / "env").read_text()


def _registry(collector: gpu.GpuCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def test_values_the_card_does_not_give_are_left_out(smi: FakeSmi, collectors) -> None:
    """[N/A], [Not Supported] and anything that is not a plain number: no series, never a 0."""
    smi.answer(
        [
            f"0, {UUID0}, [N/A], 41, 14300, 15360, 63, [N/A], 70.00, [Not Supported]",
            f"1, {UUID1}, N/A, , -5, nan, inf, 1e3, 70 W, 0x10",
        ]
    )
    collector = collectors(smi)
    collector.poll_once()
    series = gpu_series(collector)
    assert {name for name, g in series if g == "0"} == {
        "gemma_rig_gpu_memory_utilization_ratio",
        "gemma_rig_gpu_memory_used_bytes",
        "gemma_rig_gpu_memory_total_bytes",
        "gemma_rig_gpu_temperature_celsius",
        "gemma_rig_gpu_power_limit_watts",
    }
    assert not [key for key in series if key[1] == "1"]
    assert errors(collector, "row") == 0  # the lines are whole: only their values are missing


def test_a_line_with_the_wrong_field_count_is_dropped(smi: FakeSmi, collectors) -> None:
    smi.answer(
        [
            T4_0,
            f"1, {UUID1}, 0, 0, 3, 15360, 38, 9.81, 70.00",  # a field short
            f"2, {UUID1[:-1]}2, Tesla T4, PCIe, 0, 0, 3, 15360, 38, 9.81, 70.00, 300",  # a comma too many
        ]
    )
    collector = collectors(smi)
    collector.poll_once()
    assert {g for _, g in gpu_series(collector)} == {"0"}
    assert errors(collector, "row") == 2


@pytest.mark.parametrize(
    ("index", "uuid"),
    [
        ("1", 'GPU-a8"} 1\ngemma_rig_evil{x="'),
        ("1", "GPU-A81F3C07-6D2E"),  # not the tool's lowercase
        ("1", "MIG-a81f3c07-6d2e"),
        ("1", "GPU-" + "a" * 65),
        ("1", "GPU-"),
        ("-1", UUID1),
        ("0x1", UUID1),
        ("1 1", UUID1),
        ("1234", UUID1),
        ("0", UUID1),  # the same index twice
        ("1", UUID0),  # the same uuid twice
    ],
)
def test_a_line_with_a_hostile_label_is_dropped(smi: FakeSmi, collectors, index: str, uuid: str) -> None:
    smi.answer([T4_0, f"{index}, {uuid}, 0, 0, 3, 15360, 38, 9.81, 70.00, 300"])
    collector = collectors(smi)
    collector.poll_once()
    text = generate_latest(_registry(collector)).decode()
    assert "evil" not in text and "MIG-" not in text
    assert {g for _, g in gpu_series(collector)} == {"0"}
    assert text.count(f'uuid="{UUID0}"') == len(gpu.VALUE_FIELDS)
    assert errors(collector, "row") == 1 + uuid.count("\n")  # a newline makes two bad lines


def test_too_many_lines_are_not_all_served(smi: FakeSmi, collectors) -> None:
    lines = [f"{n}, GPU-{n:08x}, 1, 1, 1, 1, 1, 1, 1, 1" for n in range(gpu.MAX_GPUS + 5)]
    smi.answer(lines)
    collector = collectors(smi)
    collector.poll_once()
    assert len({g for _, g in gpu_series(collector)}) == gpu.MAX_GPUS
    assert errors(collector, "row") == 5


def test_a_failing_tool_is_counted_and_its_last_answer_ages_out(smi: FakeSmi, collectors) -> None:
    collector = collectors(smi, poll=0.1)
    collector.poll_once()
    assert gpu_series(collector)
    smi.answer(["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."], rc=9)
    collector.poll_once()
    assert errors(collector, "exit") == 1
    assert gpu_series(collector)  # one failed poll: the last answer is still fresh
    wait_for(lambda: not gpu_series(collector))  # aged out after STALE_POLLS polls' time
    assert ("gemma_rig_gpu_last_success_timestamp_seconds", "") in scrape(collector)
    smi.answer([])
    collector.poll_once()
    assert errors(collector, "empty") == 1
    smi.path.unlink()
    collector.poll_once()
    assert errors(collector, "spawn") == 1


def test_a_hanging_tool_is_cut_off_and_the_thread_goes_on(smi: FakeSmi, collectors) -> None:
    collector = collectors(smi, poll=0.2)
    collector.start()
    wait_for(lambda: bool(gpu_series(collector)))
    smi.hang(True)
    wait_for(lambda: not gpu_series(collector) and errors(collector, "timeout") >= 1)
    assert collector._thread is not None and collector._thread.is_alive()
    smi.hang(False)
    wait_for(lambda: bool(gpu_series(collector)))


def test_collect_runs_no_process(smi: FakeSmi, collectors) -> None:
    """vLLM serves /metrics in its event loop: a scrape only reads the poll thread's snapshot."""
    collector = collectors(smi, poll=60)
    assert not gpu_series(collector) and smi.runs() == []  # nothing until the thread polls
    collector.start()
    wait_for(lambda: bool(gpu_series(collector)))
    registry = _registry(collector)
    for _ in range(100):
        list(collector.collect())
        generate_latest(registry)
    assert len(smi.runs()) == 1


def test_without_nvidia_smi_nothing_is_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(gpu.BINARY_ENV, raising=False)
    monkeypatch.setattr(gpu, "_registered", None)
    monkeypatch.setattr(gpu, "_looked", False)
    registry = CollectorRegistry()
    assert gpu.register(registry) is None
    assert generate_latest(registry) == b""


@pytest.mark.parametrize(
    "named", ["nvidia-smi", "./bin/nvidia-smi", "/nonexistent/nvidia-smi", "DIR", "TEXT"]
)
def test_a_bad_binary_override_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    (tmp_path / "text").write_text("not a program\n")
    named = {"DIR": str(tmp_path), "TEXT": str(tmp_path / "text")}.get(named, named)
    monkeypatch.setenv(gpu.BINARY_ENV, named)
    with pytest.raises(ValueError, match=gpu.BINARY_ENV):
        gpu.find_binary()


@pytest.mark.parametrize("text", ["0", "-1", "0.01", "601", "nan", "inf", "ten", "1e9"])
def test_a_bad_poll_period_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(gpu.POLL_ENV, text)
    with pytest.raises(ValueError, match=gpu.POLL_ENV):
        gpu.poll_seconds()


def test_the_poll_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu.POLL_ENV, raising=False)
    assert gpu.poll_seconds() == gpu.DEFAULT_POLL_SECONDS
    monkeypatch.setenv(gpu.POLL_ENV, "2.5")
    assert gpu.poll_seconds() == 2.5


def test_the_guard_registers_it_once(smi: FakeSmi, monkeypatch: pytest.MonkeyPatch) -> None:
    """ServedPathsGuard's __init__ registers the collector where the tool is; a second guard adds none."""
    registry = CollectorRegistry()
    monkeypatch.setattr(gpu, "REGISTRY", registry)
    monkeypatch.setattr(gpu, "_registered", None)
    monkeypatch.setattr(gpu, "_looked", False)
    monkeypatch.setenv(gpu.BINARY_ENV, str(smi.path))
    _guard_env(monkeypatch)

    async def app(scope, receive, send) -> None:
        raise AssertionError("not called")

    ServedPathsGuard(app)
    collector = gpu._registered
    assert collector is not None
    try:
        ServedPathsGuard(app)  # a second registration of the same names would raise here
        assert gpu._registered is collector
        wait_for(lambda: "gemma_rig_gpu_utilization_ratio{" in generate_latest(registry).decode())
    finally:
        collector.stop(timeout=5)
