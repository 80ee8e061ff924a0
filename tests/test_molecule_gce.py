"""The molecule scenario `gce`: a gce rig without a GPU in a Debian 13 systemd container.

The CUDA vllm==0.29.0 wheels (from the controller's wheelhouse), the clamp checked with the rig's
python, tpu.env and the hardened unit converge for real; the driver and serving are skipped with
the reason shown. Prints its wall time.
"""

from __future__ import annotations

import pytest

from tests.molecule_run import run_scenario


@pytest.mark.slow
@pytest.mark.molecule("gce")
@pytest.mark.timeout(3600)
def test_molecule_gce() -> None:
    """`molecule test -s gce` passes end to end, and shows what it skipped and why."""
    result = run_scenario("gce")
    assert result.rc == 0, result.tail
    assert "[gce > idempotence] Executed: Successful" in result.output
    assert "SKIPPED (no GPU)" in result.output
    assert "Not starting vllm: no GPU" in result.output
    assert "vllm.service exposure" in result.output
