"""Shared pytest set-up: repository paths and the environment every test runs in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# torch before anything imports ansible: ansible-core's module_utils patch sys.intern when they
# are imported, and torch._dynamo (which vLLM imports) then refuses it at its own import
# ("substitute_in_graph expects a function"). Collection order decides which comes first, so
# `pytest tests/unit` alone failed to collect; importing torch._dynamo here fixes the order.
import torch._dynamo  # noqa: F401  # isort: skip

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"

# Ansible and podman read these; set them once so every subprocess a test starts agrees.
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "files" / "containers.conf"))
os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return ROOT


@pytest.fixture
def figure(capsys: pytest.CaptureFixture[str]):
    """Print a measured figure straight to the terminal, so every run's output shows it."""

    def _print(label: str, value: str) -> None:
        with capsys.disabled():
            print(f"\n[figure] {label}: {value}", flush=True)

    return _print
