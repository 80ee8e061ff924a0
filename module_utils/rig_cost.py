"""What a rig costs: the one computation behind playbooks/cost.yml, the MCP ``cost`` tool and the
teardown's "still costs money" line (docs/cost.md).

Pure functions over what the API returned (an Instance and its Disks as REST JSON, or a TPU Node),
the dated price table (inventory/group_vars/all/prices.yml, ``rig_prices``) and "now". Every value
read back from an API is checked before it is used: a URL or timestamp of an unexpected shape is a
CostError of one line, never a figure.

Cloud Billing's month is US Pacific time; so is the report's. Money is rounded to the cent only
in the result, each figure once.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

BILLING_TZ = ZoneInfo("America/Los_Angeles")
# RFC 3339 date-time with an offset (Z or +hh:mm), 0 to 9 fraction digits.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})")
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
# VM states in which Compute Engine bills the VM's vCPUs, memory and GPUs: uptime runs from a start
# until the VM is TERMINATED (https://cloud.google.com/compute/vm-instance-pricing, "Instance uptime").
GCE_BILLED = frozenset({"RUNNING", "STOPPING", "SUSPENDING"})
# "Charges for Cloud TPU accrue while your TPU node is in a READY state" (https://cloud.google.com/tpu/pricing).
TPU_BILLED = frozenset({"READY"})
STOP_REASON_LABEL = "rig-stop-reason"
# What stopped a TERMINATED VM, read from the newest zone operation that stops one. A poweroff
# inside the guest is how a rig's idle stop ends it (docs/idle.md); a person's poweroff on the VM
# reads the same, which docs/cost.md says.
STOPPED_BY = {
    "compute.instances.guestTerminate": "guest",
    "stop": "user",
    "compute.instances.preempted": "preempted",
}
# The reasons whose stopped hours count as saved by the idle stop: the label's, and the guest's own.
IDLE_REASONS = frozenset({"idle", "guest"})
_ID = re.compile(r"[0-9]{1,20}")


class CostError(ValueError):
    """A value the report cannot use; its message is one line naming the field and the value."""


def instance_id(instance: dict[str, Any]) -> str:
    """The VM's numeric id, checked before it goes into a list filter."""
    value = instance.get("id")
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise CostError(f"id is not an instance id: {_shown(value)}")
    return value


def stopped_by(instance: dict[str, Any], operations: list[dict[str, Any]]) -> str:
    """Why a TERMINATED VM stopped (STOPPED_BY's words), from its zone operations; empty when
    none that stops it is newer than its last start (the API keeps operations for a while only)."""
    since = instance.get("lastStartTimestamp")
    start = parse_time(since, "lastStartTimestamp") if since is not None else None
    found: tuple[datetime, str] | None = None
    for op in operations:
        kind = op.get("operationType")
        if kind not in STOPPED_BY or op.get("targetId") != instance.get("id"):
            continue
        when = parse_time(op.get("insertTime"), "operation insertTime")
        if (start is None or when >= start) and (found is None or when > found[0]):
            found = (when, STOPPED_BY[kind])
    return found[1] if found else ""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_time(value: Any, field: str) -> datetime:
    """An API timestamp (RFC 3339 with an offset) as an aware datetime."""
    match = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if not match:
        raise CostError(f"{field} is not an RFC 3339 timestamp with an offset: {_shown(value)}")
    text = value
    if match.group(2) and len(match.group(2)) > 6:  # datetime keeps microseconds
        text = value.replace(match.group(1), "." + match.group(2)[:6])
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CostError(f"{field} is not a valid date and time: {_shown(value)}") from None


def resource_name(url: Any, collection: str, field: str) -> str:
    """The last part of a Compute URL or partial path whose next-to-last part is ``collection``
    (``.../zones/us-central1-a/machineTypes/n1-standard-2`` -> ``n1-standard-2``)."""
    parts = url.split("/") if isinstance(url, str) else []
    if len(parts) < 2 or parts[-2] != collection or not _NAME.fullmatch(parts[-1]):
        raise CostError(f"{field} is not a {collection} URL: {_shown(url)}")
    return parts[-1]


def region_of(zone: str) -> str:
    if not _NAME.fullmatch(zone or "") or zone.count("-") < 2:
        raise CostError(f"zone is not a zone name: {_shown(zone)}")
    return zone.rsplit("-", 1)[0]


def month_of(now: datetime) -> tuple[datetime, datetime]:
    """The billing month holding ``now``: its first instant and the next month's."""
    local = now.astimezone(BILLING_TZ)
    start = datetime(local.year, local.month, 1, tzinfo=BILLING_TZ)
    after = datetime(local.year + local.month // 12, local.month % 12 + 1, 1, tzinfo=BILLING_TZ)
    return start, after


def _hours(start: datetime, end: datetime) -> float:
    return max((end.astimezone(UTC) - start.astimezone(UTC)) / timedelta(hours=1), 0.0)


class Prices:
    """The price table: ``rig_prices`` as prices.yml writes it."""

    def __init__(self, table: Any) -> None:
        if not isinstance(table, dict) or not isinstance(table.get("items"), list):
            raise CostError("the price table (rig_prices) has no items list")
        self.as_of = str(table.get("as_of") or "")
        self.index: dict[tuple[str, str, str], dict[str, Any]] = {}
        for entry in table["items"]:
            key = (str(entry.get("what")), str(entry.get("region")), str(entry.get("model", "standard")))
            self.index[key] = entry

    def find(self, what: str, region: str, model: str, unit: str) -> tuple[float | None, str]:
        """(USD per unit or None, a note when the price is missing or unconfirmed)."""
        entry = self.index.get((what, region, model))
        label = f"{what} ({model}, {region})"
        if entry is None or entry.get("usd") is None:
            return None, f"no price for {label} in the table of {self.as_of}"
        if entry.get("unit") != unit:
            raise CostError(f"the price of {label} is per {entry.get('unit')}, not per {unit}")
        note = "" if entry.get("confirmed") is True else f"{label}: unconfirmed price"
        return float(entry["usd"]), note


class _Bill:
    """Prices gathered for one rig: running and stopped rates, and what could not be priced."""

    def __init__(self, prices: Prices, region: str, month_hours: float) -> None:
        self.prices, self.region, self.month_hours = prices, region, month_hours
        self.compute_per_hour = 0.0
        self.disks_per_hour = 0.0
        self.unpriced: list[str] = []
        self.unconfirmed: list[str] = []

    def price(self, what: str, model: str, unit: str) -> float:
        usd, note = self.prices.find(what, self.region, model, unit)
        if usd is None:
            self.unpriced.append(note)
            return 0.0
        if note:
            self.unconfirmed.append(note)
        return usd


def _disk(
    disk: dict[str, Any], bill: _Bill, month: tuple[datetime, datetime], now: datetime
) -> dict[str, Any]:
    name = str(disk.get("name") or "")
    kind = resource_name(disk.get("type"), "diskTypes", f"disk {name} type")
    size = disk.get("sizeGb")
    if not isinstance(size, str | int) or not str(size).isdigit():
        raise CostError(f"disk {name} sizeGb is not a whole number: {_shown(size)}")
    gb = int(size)
    per_month = gb * bill.price(f"disk/{kind}", "standard", "gb_month")
    created = parse_time(disk.get("creationTimestamp"), f"disk {name} creationTimestamp")
    existed = _hours(max(month[0], created), now)
    bill.disks_per_hour += per_month / bill.month_hours
    return {
        "name": name,
        "type": kind,
        "size_gb": gb,
        "usd_per_month": round(per_month, 2),
        "_to_date": per_month * existed / bill.month_hours,
    }


def _run_hours(
    inst: dict[str, Any], status: str, month_start: datetime, now: datetime
) -> tuple[float, str, float]:
    """Hours the VM ran this month as the instance resource shows them: (hours, how they were
    measured, hours in which earlier runs may have happened that the resource no longer shows)."""
    created = parse_time(inst.get("creationTimestamp"), "creationTimestamp")
    start = inst.get("lastStartTimestamp")
    stop = inst.get("lastStopTimestamp")
    started = parse_time(start, "lastStartTimestamp") if start is not None else None
    stopped = parse_time(stop, "lastStopTimestamp") if stop is not None else None
    if started is None:  # never ran
        return 0.0, "measured", 0.0
    if status in GCE_BILLED:
        end = now
    elif stopped is not None and stopped >= started:
        end = stopped
    else:  # stopped with no stop time after its last start: when it stopped is not known
        return 0.0, "lower bound", _hours(max(month_start, created), now)
    hours = _hours(max(month_start, started), min(end, now))
    # The resource keeps only the last start and stop. A VM never stopped before its last start has
    # run once, since that start; so has one whose last stop before that start is last month's.
    earlier_stop = stopped is not None and stopped < started and stopped >= month_start
    unseen = status not in GCE_BILLED and started > month_start
    if earlier_stop or unseen:
        return hours, "lower bound", _hours(max(month_start, created), started)
    return hours, "measured", 0.0


def _finish(
    report: dict[str, Any], bill: _Bill, running: bool, hours: float, disks_to_date: float,
    month: tuple[datetime, datetime], now: datetime, stopped_since: datetime | None, stop_reason: str,
) -> dict[str, Any]:  # fmt: skip
    running_rate = bill.compute_per_hour + bill.disks_per_hour
    rate_now = running_rate if running else bill.disks_per_hour
    to_date = hours * bill.compute_per_hour + disks_to_date
    idle = stopped_since is not None and stop_reason in IDLE_REASONS
    idle_hours = _hours(max(month[0], stopped_since), now) if idle else 0.0
    report.update(
        usd_per_hour_running=round(running_rate, 4),
        usd_per_hour_stopped=round(bill.disks_per_hour, 4),
        usd_per_hour_now=round(rate_now, 4),
        hours_run=round(hours, 2),
        month_to_date_usd=round(to_date, 2),
        projected_month_usd=round(to_date + rate_now * _hours(now, month[1]), 2),
        stop_reason=stop_reason,
        idle_saved_usd=round(idle_hours * bill.compute_per_hour, 2),
        unpriced=bill.unpriced,
        unconfirmed=bill.unconfirmed,
        month_start=month[0].isoformat(),
        now=now.astimezone(BILLING_TZ).isoformat(timespec="seconds"),
    )
    what = "data disk" if report["state"] == "ABSENT" else "disk"
    report["still_costs"] = (
        [f"{report['rig']} running, about ${bill.compute_per_hour:.2f}/h"] if running else []
    ) + [
        f"{what} {d['name']} in {report['zone']}, {d['size_gb']} GB {d['type']}, about ${d['usd_per_month']:.2f}/month"
        for d in report["disks"]
    ]
    return report


def gce_report(
    rig: str, zone: str, instance: dict[str, Any] | None, disks: list[dict[str, Any]],
    table: Any, now: datetime, operations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One Compute Engine rig: ``instance`` (None when there is none), the disks that bill for
    it (attached ones, or the data disk a teardown kept), and its zone operations (read when it is
    stopped: what stopped it)."""
    prices = Prices(table)
    month = month_of(now)
    bill = _Bill(prices, region_of(zone), _hours(*month))
    report: dict[str, Any] = {"rig": rig, "platform": "gce", "zone": zone, "price_table_as_of": prices.as_of}
    running, hours, how, unknown, stopped_since, reason = False, 0.0, "lower bound", 0.0, None, ""
    if instance is None:
        report.update(state="ABSENT", machine_type="", accelerator="", provisioning_model="")
    else:
        status = str(instance.get("status") or "")
        machine = resource_name(instance.get("machineType"), "machineTypes", "machineType")
        model = str((instance.get("scheduling") or {}).get("provisioningModel") or "STANDARD").lower()
        bill.compute_per_hour += bill.price(f"machine/{machine}", model, "hour")
        gpus = []
        for gpu in instance.get("guestAccelerators") or []:
            kind = resource_name(gpu.get("acceleratorType"), "acceleratorTypes", "acceleratorType")
            count = gpu.get("acceleratorCount")
            if not isinstance(count, int) or not 0 < count <= 16:
                raise CostError(f"acceleratorCount is not a GPU count: {_shown(count)}")
            bill.compute_per_hour += count * bill.price(f"gpu/{kind}", model, "hour")
            gpus.append(f"{count} x {kind}")
        for nic in instance.get("networkInterfaces") or []:
            if addresses := len(nic.get("accessConfigs") or []):
                bill.compute_per_hour += addresses * bill.price("external-ipv4", model, "hour")
        running = status in GCE_BILLED
        hours, how, unknown = _run_hours(instance, status, month[0], now)
        if status == "TERMINATED" and instance.get("lastStopTimestamp") is not None:
            stopped_since = parse_time(instance["lastStopTimestamp"], "lastStopTimestamp")
            label = str((instance.get("labels") or {}).get(STOP_REASON_LABEL) or "")
            reason = label or stopped_by(instance, operations or [])
        report.update(
            state=status, machine_type=machine, accelerator=", ".join(gpus), provisioning_model=model
        )
    rows = [_disk(d, bill, month, now) for d in disks]
    report["disks"] = [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]
    report.update(hours_run_is=how, hours_unknown=round(unknown, 2))
    return _finish(
        report, bill, running, hours, sum(r["_to_date"] for r in rows), month, now, stopped_since, reason
    )


def tpu_report(
    rig: str, zone: str, node: dict[str, Any] | None, provisioning_model: str, table: Any, now: datetime
) -> dict[str, Any]:
    """One Cloud TPU rig. The node keeps its createTime and state only: the hours since createTime
    count the minutes the node spent being made, so they are an upper bound while it is READY."""
    prices = Prices(table)
    month = month_of(now)
    bill = _Bill(prices, region_of(zone), _hours(*month))
    report: dict[str, Any] = {"rig": rig, "platform": "tpu", "zone": zone, "price_table_as_of": prices.as_of}
    running, hours, how = False, 0.0, "lower bound"
    if node is None:
        report.update(state="ABSENT", machine_type="", accelerator="", provisioning_model=provisioning_model)
    else:
        state = str(node.get("state") or "")
        kind = str(node.get("acceleratorType") or "")
        if not re.fullmatch(r"v[0-9a-z]+-[0-9]{1,4}", kind):
            raise CostError(f"acceleratorType is not a TPU type: {_shown(kind)}")
        chips = int(kind.rsplit("-", 1)[1])
        bill.compute_per_hour += chips * bill.price(
            f"tpu/{kind.split('-', maxsplit=1)[0]}", provisioning_model, "chip_hour"
        )
        created = parse_time(node.get("createTime"), "createTime")
        running = state in TPU_BILLED
        if running:
            hours, how = _hours(max(month[0], created), now), "upper bound"
        report.update(state=state, machine_type=kind, accelerator=f"{chips} chip(s)",
                      provisioning_model=provisioning_model)  # fmt: skip
    report.update(disks=[], hours_run_is=how, hours_unknown=0.0)
    return _finish(report, bill, running, hours, 0.0, month, now, None, "")
