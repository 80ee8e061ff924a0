"""The molecule scenario `local`: the whole rig in a Debian 12 systemd container, serving tiny-emb4.

create, prepare (the tiny model on the controller), converge, idempotence (zero changed),
verify (chat answer, /v1/models, tpu.env, the service's user, hardening score, refusal without
the clamp), destroy. Prints its wall time.
"""

from __future__ import annotations

import pytest

from tests.molecule_run import run_scenario


@pytest.mark.slow
@pytest.mark.molecule
@pytest.mark.timeout(3600)
def test_molecule_local() -> None:
    """`molecule test -s local` passes end to end."""
    result = run_scenario("local")
    assert result.rc == 0, result.tail
    assert "[local > idempotence] Executed: Successful" in result.output
    assert "vllm.service exposure" in result.output
