"""Two local rigs in one inventory: site.yml stands up the second and leaves the first alone.

The rolling swap of the two (one rig at a time, the log's order, the later start of rig-b), the
broken model that stops the rollout at the first rig, and query/status following the served
model afterwards are test_25_gateway's: the same rollout with the gateway in front, so one
rollout proves both.
"""

from __future__ import annotations

import pytest

from tests.ansible_run import run_playbook
from tests.e2e.conftest import FLEET_INVENTORY, hands_over_the_fleet
from tests.e2e.rig import assert_serving, served_build

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start

FLEET = FLEET_INVENTORY
RIGS = {"rig-local": ("gemma-rig", 8000), "rig-b": ("gemma-rig-b", 8001)}


@pytest.fixture(scope="module", name="fleet")
def fleet_here(fleet, local_rig, request):
    yield fleet
    if hands_over_the_fleet(request):
        return  # test_25 takes both rigs as they are
    down = run_playbook("teardown.yml", "-l", "rig-b", *FLEET)
    assert down.rc == 0, down.output[-4000:]
    # The next test files expect the shared rig as site.yml left it: serving tiny-emb4.
    if served_build(local_rig.port) != local_rig.model:
        back = run_playbook("swap.yml", "-e", f"model={local_rig.model}")
        assert back.rc == 0, back.output[-4000:]
    assert_serving(local_rig.container, local_rig.port, local_rig.model)


def test_second_rig_joins_and_the_first_is_left_alone(fleet, figure) -> None:
    figure(
        "site.yml with a second local rig beside the first",
        f"{fleet.seconds:.0f} s; slowest tasks: {fleet.slowest(6)}",
    )
    assert fleet.recap["rig-local"]["changed"] == 0
    for container, port in RIGS.values():
        assert_serving(container, port, "tiny-emb4")
