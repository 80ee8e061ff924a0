"""The cost report (library/rig_cost.py, module_utils/rig_cost.py) against the fake APIs: the VM's
timestamps as the fake wrote them on insert, stop and start, priced with the repository's price
table, to the cent. The fakes' clocks and the report's "now" are fixed; the subject is not mocked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml

from plugins.filter.rig_cost_fleet import rig_cost_fleet
from tests.fake_compute.harness import run_module
from tests.fake_compute.server import FakeComputeServer
from tests.fake_compute.state import Faults
from tests.fake_tpu.server import FakeTpuServer
from tests.fake_tpu.state import Faults as TpuFaults

ROOT = Path(__file__).resolve().parents[2]
PRICES = yaml.safe_load((ROOT / "inventory/group_vars/all/prices.yml").read_text())["rig_prices"]
PT = ZoneInfo("America/Los_Angeles")
API_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}-0[78]:00")  # the API's: Pacific, ms
VM = {"project": "proj", "zones": ["us-central1-a"], "name": "rig1"}
NOW = "2026-12-03T08:01:02-08:00"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def price(what: str, region: str = "us-central1", model: str = "standard") -> float:
    (entry,) = [e for e in PRICES["items"] if (e["what"], e["region"], e["model"]) == (what, region, model)]
    return float(entry["usd"])


def hours(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() / 3600


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults()) as server:
        yield server


def cost(fake: FakeComputeServer, **extra: Any) -> dict[str, Any]:
    args = {**VM, "platform": "gce", "data_disk": "rig1-data", "prices": PRICES, "now": NOW, **extra}
    return run_module(fake.endpoint, module="rig_cost", **args)


def vm_history(fake: FakeComputeServer) -> dict[str, Any]:
    """Made last month, stopped early on the 1st, started again on the 2nd: the VM as the API keeps it."""
    for moment, state in (
        ("2026-11-28T10:00:00-08:00", "started"),
        ("2026-12-01T06:00:00-08:00", "stopped"),
        ("2026-12-02T12:00:00-08:00", "started"),
    ):
        fake.api.clock = lambda m=moment: at(m)
        done = run_module(fake.endpoint, state=state, **VM)
        assert not done.get("failed"), done
    return fake.api.instances[("us-central1-a", "rig1")]


def test_a_running_t4_rig_to_the_cent(fake: FakeComputeServer) -> None:
    inst = vm_history(fake)
    # What the module reads is written as the API writes it (milliseconds, the zone's offset).
    stamps = [inst["creationTimestamp"], inst["lastStopTimestamp"], inst["lastStartTimestamp"]]
    assert all(API_STAMP.fullmatch(s) for s in stamps), stamps
    got = cost(fake)
    assert not got.get("failed") and got["changed"] is False, got
    report = got["report"]
    now, started = at(NOW), at(inst["lastStartTimestamp"])
    month, after = datetime(2026, 12, 1, tzinfo=PT), datetime(2027, 1, 1, tzinfo=PT)
    compute = price("machine/n1-standard-2") + price("gpu/nvidia-tesla-t4") + price("external-ipv4")
    disks_month = 32 * price("disk/pd-ssd") + 250 * price("disk/pd-balanced")
    disks_hour = disks_month / hours(month, after)
    to_date = hours(started, now) * compute + disks_month * hours(month, now) / hours(month, after)
    assert report["state"] == "RUNNING" and report["machine_type"] == "n1-standard-2"
    assert report["accelerator"] == "1 x nvidia-tesla-t4"
    assert {(d["name"], d["type"], d["size_gb"]) for d in report["disks"]} == {
        ("rig1", "pd-ssd", 32), ("rig1-data", "pd-balanced", 250)
    }  # fmt: skip
    assert report["hours_run"] == round(hours(started, now), 2)
    assert report["usd_per_hour_running"] == round(compute + disks_hour, 4)
    assert report["usd_per_hour_stopped"] == round(disks_hour, 4)
    assert report["month_to_date_usd"] == round(to_date, 2)
    assert report["projected_month_usd"] == round(to_date + (compute + disks_hour) * hours(now, after), 2)
    # The run of the 1st (00:00 to 06:00) is gone from the resource: the hours are a lower bound,
    # and the report says how many hours it cannot see into.
    assert report["hours_run_is"] == "lower bound"
    assert report["hours_unknown"] == round(hours(month, started), 2)
    assert report["idle_saved_usd"] == 0 and report["price_table_as_of"] == PRICES["as_of"]
    assert "gpu/nvidia-tesla-t4 (standard, us-central1): unconfirmed price" in report["unconfirmed"]
    assert report["unpriced"] == []


def test_a_vm_never_stopped_is_measured_and_an_idle_stop_says_what_it_saved(fake: FakeComputeServer) -> None:
    fake.api.clock = lambda: at("2026-12-01T09:00:00-08:00")
    assert not run_module(fake.endpoint, state="started", **VM).get("failed")
    running = cost(fake)["report"]
    assert running["hours_run_is"] == "measured" and running["hours_unknown"] == 0
    assert running["hours_run"] == round(hours(at("2026-12-01T09:00:00-08:00"), at(NOW)), 2)

    fake.api.clock = lambda: at("2026-12-02T09:00:00-08:00")
    assert not run_module(fake.endpoint, state="stopped", **VM).get("failed")
    fake.api.instances[("us-central1-a", "rig1")]["labels"] = {"rig-stop-reason": "idle"}
    stopped = cost(fake)["report"]
    compute = price("machine/n1-standard-2") + price("gpu/nvidia-tesla-t4") + price("external-ipv4")
    assert stopped["state"] == "TERMINATED" and stopped["hours_run"] == 24
    assert stopped["usd_per_hour_now"] == stopped["usd_per_hour_stopped"]
    assert stopped["idle_saved_usd"] == round(hours(at("2026-12-02T09:00:00-08:00"), at(NOW)) * compute, 2)


def test_the_zone_operations_say_what_stopped_a_vm_and_only_its_own_poweroff_saved(
    fake: FakeComputeServer,
) -> None:
    """No label: the newest stopping operation since the last start names the reason. The guest's
    own poweroff (the idle stop's) saves its stopped hours; a user's stop and a preemption do not,
    and a poweroff before the last start is not this stop's."""
    compute = price("machine/n1-standard-2") + price("gpu/nvidia-tesla-t4") + price("external-ipv4")
    fake.api.clock = lambda: at("2026-12-01T09:00:00-08:00")
    assert not run_module(fake.endpoint, state="started", **VM).get("failed")
    fake.api.clock = lambda: at("2026-12-02T09:00:00-08:00")
    fake.api.guest_terminate("us-central1-a", "rig1")
    guest = cost(fake)["report"]
    assert (guest["state"], guest["stop_reason"]) == ("TERMINATED", "guest")
    assert guest["idle_saved_usd"] == round(hours(at("2026-12-02T09:00:00-08:00"), at(NOW)) * compute, 2)

    fake.api.clock = lambda: at("2026-12-02T12:00:00-08:00")
    assert not run_module(fake.endpoint, state="started", **VM).get("failed")
    fake.api.clock = lambda: at("2026-12-02T15:00:00-08:00")
    assert not run_module(fake.endpoint, state="stopped", **VM).get("failed")
    user = cost(fake)["report"]
    assert (user["stop_reason"], user["idle_saved_usd"]) == ("user", 0)
    assert (user["hours_run"], user["hours_run_is"]) == (
        3,
        "lower bound",
    )  # the first run is gone from the VM

    fake.api.clock = lambda: at("2026-12-02T16:00:00-08:00")
    assert not run_module(fake.endpoint, state="started", **VM).get("failed")
    fake.api.preempt("us-central1-a", "rig1")
    preempted = cost(fake)["report"]
    assert (preempted["state"], preempted["stop_reason"], preempted["idle_saved_usd"]) == (
        "TERMINATED",
        "preempted",
        0,
    )

    fake.api.clock = lambda: at("2026-12-02T17:00:00-08:00")
    assert not run_module(fake.endpoint, state="started", **VM).get("failed")
    fake.api.instances[("us-central1-a", "rig1")]["status"] = "TERMINATED"  # stopped with no operation kept
    assert cost(fake)["report"]["stop_reason"] == ""


@pytest.mark.parametrize(
    ("instance", "ops", "message"),
    [
        ({"id": '1" OR targetId != "0'}, [], "id is not an instance id"),
        ({"id": 7}, [], "id is not an instance id"),
        ({"id": "7"}, [{"operationType": "stop", "targetId": "7", "insertTime": "yesterday"}], "insertTime"),
    ],
)
def test_hostile_ids_and_operations_from_the_api_are_one_line_errors(instance, ops, message) -> None:
    from module_utils.rig_cost import CostError, instance_id, stopped_by

    with pytest.raises(CostError, match=message) as err:
        instance_id(instance)
        stopped_by(instance, ops)
    assert "\n" not in str(err.value)


def test_a_torn_down_rig_still_pays_for_its_data_disk(fake: FakeComputeServer) -> None:
    fake.api.clock = lambda: at("2026-11-02T00:00:00-08:00")
    fake.api.add_disk("proj", "us-central1-a", "rig1-data", 250, "pd-balanced")
    report = cost(fake)["report"]
    assert report["state"] == "ABSENT" and report["usd_per_hour_running"] == report["usd_per_hour_stopped"]
    assert report["still_costs"] == [
        f"data disk rig1-data in us-central1-a, 250 GB pd-balanced, about ${250 * price('disk/pd-balanced'):.2f}/month"
    ]


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        (
            "machineType",
            "https://evil.example/x/machineTypes/n1 standard",
            "machineType is not a machineTypes URL",
        ),
        ("machineType", "zones/us-central1-a/diskTypes/pd-ssd", "machineType is not a machineTypes URL"),
        ("lastStartTimestamp", "yesterday", "lastStartTimestamp is not an RFC 3339 timestamp"),
        ("lastStartTimestamp", "2026-12-02T12:00:00", "lastStartTimestamp is not an RFC 3339 timestamp"),
        ("creationTimestamp", "2026-13-45T99:00:00.000-08:00", "creationTimestamp is not a valid date"),
    ],
)
def test_a_hostile_value_read_back_is_one_line_never_a_figure(
    fake: FakeComputeServer, field: str, value: str, said: str
) -> None:
    vm_history(fake)
    fake.api.instances[("us-central1-a", "rig1")][field] = value
    got = cost(fake)
    assert got.get("failed") and "report" not in got, got
    assert said in got["msg"] and "\n" not in got["msg"] and got["msg"].startswith("rig1: "), got["msg"]


def test_a_tpu_rig_from_its_create_time() -> None:
    with FakeTpuServer(TpuFaults(op_delay=0.02, provision_delay=0.05)) as server:
        server.api.clock = lambda: at("2026-12-02T00:00:00Z")
        made = run_module(
            server.endpoint, module="tpu_node", project="proj", zones=["us-west4-a"], name="tpu1",
            provisioning_model="flex-start",
        )  # fmt: skip
        assert not made.get("failed"), made
        got = run_module(
            server.endpoint, module="rig_cost", platform="tpu", project="proj", zones=["us-west4-a"],
            name="tpu1", provisioning_model="flex-start", prices=PRICES, now=NOW,
        )  # fmt: skip
    report = got["report"]
    created = at("2026-12-02T00:00:00+00:00")
    assert report["state"] == "READY" and report["machine_type"] == "v5litepod-1"
    assert report["hours_run_is"] == "upper bound"
    assert report["month_to_date_usd"] == round(
        hours(created, at(NOW)) * price("tpu/v5litepod", "us-west4", "flex-start"), 2
    )


def test_the_fleet_adds_the_rigs_rounded_figures() -> None:
    rows = [
        {"month_to_date_usd": 1.005, "projected_month_usd": 2.0, "idle_saved_usd": 0.0, "usd_per_hour_now": 0.1,
         "hours_run_is": "measured", "unpriced": []},
        {"month_to_date_usd": 2.01, "projected_month_usd": 3.0, "idle_saved_usd": 1.5, "usd_per_hour_now": 0.2,
         "hours_run_is": "lower bound", "unpriced": []},
    ]  # fmt: skip
    fleet = rig_cost_fleet(rows)
    assert fleet["month_to_date_usd"] == round(1.005 + 2.01, 2) and fleet["idle_saved_usd"] == 1.5
    assert fleet["rigs"] == 2 and fleet["all_measured"] is False
    with pytest.raises(TypeError):
        rig_cost_fleet("not a list of reports")  # type: ignore[arg-type]
