"""The molecule scenario `tpu`: a tpu rig without a chip in an Ubuntu 24.04 systemd container.

vllm-tpu==0.29.0 and tpu-inference==0.29.0 (from the controller's wheelhouse, without their
dependencies) in a Python 3.12 venv, tpu.env with the v5e settings and the hardened unit converge
for real; the chip and serving are skipped with the reason shown. Python 3.12 is Ubuntu 24.04's own
(a TPU VM's Ubuntu 22.04 gets it from the deadsnakes PPA, out of reach here; verify.yml checks the
venv's base is /usr); the image is the set-up's (scripts/build-images.sh noble), and nothing of the
controller's own interpreters is used. Prints its wall time.
"""

from __future__ import annotations

import pytest

from tests.molecule_run import run_scenario


@pytest.mark.slow
@pytest.mark.molecule("tpu")
@pytest.mark.timeout(1800)
def test_molecule_tpu() -> None:
    """`molecule test -s tpu` passes end to end, and shows what it skipped and why."""
    result = run_scenario("tpu")
    assert result.rc == 0, result.tail
    assert "[tpu > idempotence] Executed: Successful" in result.output
    assert "SKIPPED (no TPU)" in result.output
    assert "Not starting vllm: no TPU" in result.output
    assert "vllm.service exposure" in result.output
    # The patch went onto the installed 0.29.0 files once, and the unit's own check passes.
    assert "TASK [Run that check as the unit does before each start]" in result.output
    assert "[tpu > verify] Executed: Successful" in result.output
