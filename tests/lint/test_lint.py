"""Lint gates: ruff for Python, ansible-lint (production profile) and yamllint for Ansible."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import ROOT, VENV_BIN


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_check() -> None:
    result = _run(str(VENV_BIN / "ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _run(str(VENV_BIN / "ruff"), "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_ansible_lint_production() -> None:
    result = _run(str(VENV_BIN / "ansible-lint"), "--profile", "production", "--offline")
    assert result.returncode == 0, result.stdout + result.stderr
