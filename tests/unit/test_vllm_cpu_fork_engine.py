"""roles/vllm/files/vllm_cpu_fork_engine: the wrap is made only when asked for, and once.

What it does to a real server (the engine process forked, and answering) is checked on the
controller's vLLM servers (tests/controller/test_engine_start.py) and on the rig
(tests/e2e/test_05_rig_contract.py).
"""

from __future__ import annotations

import os

import pytest

vllm_cpu = pytest.importorskip("vllm.platforms.cpu")
plugin = pytest.importorskip("vllm_cpu_fork_engine")


@pytest.fixture
def platform(monkeypatch: pytest.MonkeyPatch):
    """vLLM's CpuPlatform, its config step put back after the test."""
    cls = vllm_cpu.CpuPlatform
    monkeypatch.setattr(cls, "check_and_update_config", cls.__dict__["check_and_update_config"])
    return cls


def test_not_asked_for_changes_nothing(platform, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plugin.ENV, raising=False)
    before = platform.__dict__["check_and_update_config"]
    assert plugin.register() is False
    assert platform.__dict__["check_and_update_config"] is before


@pytest.mark.parametrize("value", ["spawn", "1", ""])
def test_only_fork_is_understood(platform, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(plugin.ENV, value)
    before = platform.__dict__["check_and_update_config"]
    assert plugin.register() is False
    assert platform.__dict__["check_and_update_config"] is before


def test_asked_for_wraps_once(platform, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.ENV, "fork")
    original = platform.__dict__["check_and_update_config"].__func__
    assert plugin.register() is True
    wrapped = platform.__dict__["check_and_update_config"]
    assert isinstance(wrapped, classmethod) and wrapped.__func__ is not original
    assert plugin.register() is True  # vLLM loads general plugins in every process, some twice
    assert platform.__dict__["check_and_update_config"] is wrapped


def test_the_wrapper_calls_the_platform_then_sets_fork(platform, monkeypatch: pytest.MonkeyPatch) -> None:
    """The platform's own step runs first (it forces spawn), then fork is put back."""
    seen: list[object] = []

    def forced_spawn(cls, vllm_config) -> None:
        seen.append(vllm_config)
        monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

    monkeypatch.setattr(platform, "check_and_update_config", classmethod(forced_spawn))
    monkeypatch.setenv(plugin.ENV, "fork")
    assert plugin.register() is True
    marker = object()
    platform.check_and_update_config(marker)
    assert seen == [marker]
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
