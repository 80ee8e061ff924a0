"""Two local rigs in one inventory: a rolling swap updates one rig at a time. A broken model that
stops the rollout at the first rig is test_25_gateway's (the same rollout, with the gateway in
front: one failed swap and rollback for both checks)."""

from __future__ import annotations

import pytest

from tests.ansible_run import run_playbook
from tests.e2e.conftest import FLEET_INVENTORY, hands_over_the_fleet
from tests.e2e.rig import assert_serving, unit_started_at

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start

FLEET = FLEET_INVENTORY
RIGS = {"rig-local": ("gemma-rig", 8000), "rig-b": ("gemma-rig-b", 8001)}


def started_seconds(container: str) -> float:
    """The unit's last start on the host-wide monotonic clock (containers share it), in seconds."""
    return int(unit_started_at(container).split("=")[1]) / 1e6


@pytest.fixture(scope="module", name="fleet")
def fleet_here(fleet, local_rig, request):
    yield fleet
    if hands_over_the_fleet(request):
        return  # test_25 takes both rigs as they are (its rolling swap brings rig-local back)
    down = run_playbook("teardown.yml", "-l", "rig-b", *FLEET)
    assert down.rc == 0, down.output[-4000:]
    # The next test files expect the shared rig as site.yml left it: serving tiny-emb4.
    back = run_playbook("swap.yml", "-e", f"model={local_rig.model}")
    assert back.rc == 0, back.output[-4000:]
    assert_serving(local_rig.container, local_rig.port, local_rig.model)


def test_second_rig_joins_and_the_first_is_left_alone(fleet, figure) -> None:
    figure("site.yml with a second local rig beside the first", f"{fleet.seconds:.0f} s")
    assert fleet.recap["rig-local"]["changed"] == 0
    for container, port in RIGS.values():
        assert_serving(container, port, "tiny-emb4")


def test_rolling_swap_updates_one_rig_at_a_time(fleet) -> None:
    run = run_playbook("swap.yml", "-e", "model=tiny-w8a8", *FLEET)
    assert run.rc == 0, run.output[-6000:]
    for container, port in RIGS.values():
        assert_serving(container, port, "tiny-w8a8")
    # rig-b went down only after rig-local answered on its new model.
    assert run.output.index("rig-local: tiny-emb4 -> tiny-w8a8") < run.output.index(
        "rig-b: tiny-emb4 -> tiny-w8a8"
    )
    assert started_seconds("gemma-rig-b") > started_seconds("gemma-rig")


def test_query_and_status_follow_the_served_model(fleet, local_rig) -> None:
    """After the rolling swap rig-local serves tiny-w8a8 while the inventory says tiny-emb4:
    query.yml asks the served model (not a 404 for the inventory's) and status.yml says which
    it is and that the inventory differs. (Once its own file, which swapped there and back.)"""
    assert_serving(local_rig.container, local_rig.port, "tiny-w8a8")
    query = run_playbook("playbooks/query.yml", "-e", "max_tokens=16")
    assert query.rc == 0, query.output[-6000:]
    assert "tiny-w8a8: " in query.output and "does not exist" not in query.output
    status = run_playbook("playbooks/status.yml")
    assert status.rc == 0, status.output[-6000:]
    assert f"model: tiny-w8a8 (the inventory says {local_rig.model}: swapped since site.yml)" in status.output
