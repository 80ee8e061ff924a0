"""Shared pytest set-up: repository paths and the environment every test runs in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
