"""The molecule scenario `tpu`: a tpu rig without a chip in an Ubuntu 22.04 systemd container.

vllm-tpu==0.29.0 and tpu-inference==0.29.0 (from the controller's wheelhouse, without their
dependencies) in a Python 3.12 venv, tpu.env with the v5e settings and the hardened unit converge
for real; the chip and serving are skipped with the reason shown. Python 3.12 is the controller's
(pyenv's), mounted: Ubuntu 22.04 has 3.10 and the PPA a TPU VM uses is out of reach here. Prints
its wall time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.molecule_run import run_scenario

PYTHON_312 = Path(os.environ.get("MOLECULE_TPU_PYTHON_PREFIX", "/root/.pyenv/versions/3.12.1"))


@pytest.mark.slow
@pytest.mark.molecule("tpu")
@pytest.mark.timeout(1800)
def test_molecule_tpu() -> None:
    """`molecule test -s tpu` passes end to end, and shows what it skipped and why."""
    assert (PYTHON_312 / "bin" / "python3.12").exists(), (
        f"no CPython 3.12 at {PYTHON_312} to mount (set MOLECULE_TPU_PYTHON_PREFIX)"
    )
    result = run_scenario("tpu")
    assert result.rc == 0, result.tail
    assert "[tpu > idempotence] Executed: Successful" in result.output
    assert "SKIPPED (no TPU)" in result.output
    assert "Not starting vllm: no TPU" in result.output
    assert "vllm.service exposure" in result.output
    # The patch went onto the installed 0.29.0 files once, and the unit's own check passes.
    assert "TASK [Run that check as the unit does before each start]" in result.output
    assert "[tpu > verify] Executed: Successful" in result.output
