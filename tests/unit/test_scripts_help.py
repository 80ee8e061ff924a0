"""The set-up scripts answer --help with their usage, and reject a bad --only with one line."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import ROOT

SCRIPTS = ["setup.sh", "up.sh", "build-images.sh", "test.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage_and_does_nothing_else(script: str) -> None:
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert f"scripts/{script}" in res.stdout, res.stdout
    assert res.stdout.strip() and "==>" not in res.stdout + res.stderr, (
        "it ran a step instead of printing its usage"
    )
    assert "set -" not in res.stdout, "the usage ran past the header into the code"


def test_setup_names_a_bad_part_in_one_line() -> None:
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), "--only", "everything"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "error: --only takes packages, ansible, venv or images; got 'everything'"
    ]
