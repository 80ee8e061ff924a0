"""The molecule scenario `config`: rig_config + checkpoint in a systemd container (podman)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT, VENV_BIN


@pytest.mark.slow
@pytest.mark.molecule
@pytest.mark.timeout(1800)
def test_molecule_config() -> None:
    """create, prepare, converge, idempotence, verify (tpu.env, manifest, resume, keep), destroy."""
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "PY_COLORS": "0", "NO_COLOR": "1"}
    res = subprocess.run(
        [str(VENV_BIN / "molecule"), "test", "-s", "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    output = res.stdout + res.stderr
    assert res.returncode == 0, output[-20000:]
