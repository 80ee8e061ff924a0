"""The molecule scenario `config`: rig_config + checkpoint in a systemd container (podman)."""

from __future__ import annotations

import pytest

from tests.molecule_run import run_scenario


@pytest.mark.slow
@pytest.mark.molecule("config")
@pytest.mark.timeout(1800)
def test_molecule_config() -> None:
    """create, prepare, converge, idempotence, verify (tpu.env, manifest, resume, keep), destroy."""
    result = run_scenario("config")
    assert result.rc == 0, result.output[-20000:]
    assert "[config > idempotence] Executed: Successful" in result.output
    assert "[config > verify] Executed: Successful" in result.output
