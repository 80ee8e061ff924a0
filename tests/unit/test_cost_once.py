"""Each price is written once, in the dated price table (inventory/group_vars/all/prices.yml): the
figures docs/cost.md derives from it, and the headline "about $X/h running" of the README and the
docs, are what rig_cost computes for the roles' defaults at the table's prices, in every month of the
table's year; no other page and no role carries a price of its own."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from module_utils.rig_cost import gce_report, tpu_report

ROOT = Path(__file__).resolve().parents[2]
PRICES = yaml.safe_load((ROOT / "inventory/group_vars/all/prices.yml").read_text())["rig_prices"]
GCE = yaml.safe_load((ROOT / "roles/gce/defaults/main.yml").read_text())
TPU = yaml.safe_load((ROOT / "roles/tpu/defaults/main.yml").read_text())
PT = ZoneInfo("America/Los_Angeles")
# The middle of each month of the table's year: the disks' share of an hour differs by month length.
MONTHS = [datetime(int(PRICES["as_of"][:4]), m, 15, 12, tzinfo=PT) for m in range(1, 13)]
MADE = "2000-01-01T00:00:00Z"
HEADLINE = re.compile(r"about \$(\d+\.\d\d)/h running", re.IGNORECASE)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages with figures of their own: cost.md's derived ones (checked below), and the gateway VM's
# prices (e2-small, its boot disk), which the table does not hold yet; neither may copy a table price.
OWN_FIGURES = {"cost.md", "gateway.md"}


def _zone(zones: list[str]) -> str:
    return zones[0]


def gce_vm(status: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """The VM the gce role's defaults ask for, as the API returns it, and its two disks."""
    zone = _zone(GCE["gce_zones"])
    inst = {
        "status": status,
        "machineType": f"zones/{zone}/machineTypes/{GCE['gce_machine_type']}",
        "creationTimestamp": MADE,
        "lastStartTimestamp": MADE,
        "scheduling": {"provisioningModel": GCE["gce_provisioning_model"].upper()},
        "guestAccelerators": [
            {
                "acceleratorType": f"zones/{zone}/acceleratorTypes/{GCE['gce_accelerator_type']}",
                "acceleratorCount": GCE["gce_accelerator_count"],
            }
        ],
        "networkInterfaces": [{"accessConfigs": [{}] if GCE["gce_external_ip"] else []}],
    }
    disks = [
        {
            "name": name,
            "type": f"zones/{zone}/diskTypes/{kind}",
            "sizeGb": str(size),
            "creationTimestamp": MADE,
        }
        for name, kind, size in (
            ("boot", GCE["gce_boot_disk_type"], GCE["gce_boot_disk_size_gb"]),
            ("data", GCE["gce_data_disk_type"], GCE["gce_data_disk_size_gb"]),
        )
    ]
    return zone, inst, disks


def gce_running_rates() -> list[float]:
    zone, inst, disks = gce_vm("RUNNING")
    reports = [gce_report("rig", zone, inst, disks, PRICES, now) for now in MONTHS]
    assert all(not r["unpriced"] for r in reports), reports[0]["unpriced"]
    return [r["usd_per_hour_running"] for r in reports]


def derived_rows() -> dict[str, list[str]]:
    """docs/cost.md's "At the table's prices" table: the first cell's words before the first comma
    or parenthesis ("gce: the role's defaults", "tpu: v5litepod-1") plus the model, and the figures."""
    text = (ROOT / "docs/cost.md").read_text()
    section = text.split("## At the table's prices", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| gce") or line.startswith("| tpu"):
            rows[cells[0]] = cells[1:]
    return rows


def money(cell: str, unit: str) -> float:
    found = re.fullmatch(rf"about \$(\d+\.\d\d)/{unit}( \(.*\))?", cell)
    assert found, f"{cell!r} is not 'about $N.NN/{unit}'"
    return float(found[1])


def test_the_gce_figures_are_what_rig_cost_computes() -> None:
    (row,) = [cells for name, cells in derived_rows().items() if name.startswith("gce:")]
    running, stopped, torn_down = row
    rates = gce_running_rates()
    assert max(rates) - min(rates) < 0.01  # "moves by less than a cent from month to month"
    assert all(abs(money(running, "h") - rate) <= 0.01 for rate in rates), (running, rates)

    zone, inst, disks = gce_vm("TERMINATED")
    halted = gce_report("rig", zone, inst, disks, PRICES, MONTHS[0])
    assert halted["usd_per_hour_now"] == halted["usd_per_hour_stopped"] > 0
    assert money(stopped, "month") == round(sum(d["usd_per_month"] for d in halted["disks"]), 2)
    gone = gce_report("rig", zone, None, disks[1:], PRICES, MONTHS[0])
    assert money(torn_down, "month") == gone["disks"][0]["usd_per_month"]
    assert gone["still_costs"] and "data disk data" in gone["still_costs"][0]


def test_the_tpu_figures_are_what_rig_cost_computes() -> None:
    rows = {name: cells for name, cells in derived_rows().items() if name.startswith("tpu:")}
    zone, kind = _zone(TPU["tpu_zones"]), TPU["tpu_accelerator_type"]
    models = {"on-demand", "flex-start", "spot"}
    assert {name.split(", ")[1] for name in rows} == models
    for name, (running, stopped, torn_down) in rows.items():
        assert name.startswith(f"tpu: {kind}, ") and name.endswith(", " + zone[: zone.rindex("-")]), name
        model = name.split(", ")[1]
        ready = {"state": "READY", "acceleratorType": kind, "createTime": MADE}
        report = tpu_report("rig", zone, ready, model, PRICES, MONTHS[0])
        assert not report["unpriced"] and money(running, "h") == round(report["usd_per_hour_running"], 2)
        halted = tpu_report("rig", zone, {**ready, "state": "STOPPED"}, model, PRICES, MONTHS[0])
        assert stopped == "nothing" and halted["usd_per_hour_now"] == 0
        gone = tpu_report("rig", zone, None, model, PRICES, MONTHS[0])
        assert torn_down == "nothing" and gone["usd_per_hour_now"] == 0 and gone["still_costs"] == []


def test_every_headline_figure_is_the_computed_one() -> None:
    rates = gce_running_rates()
    found = {page.name: HEADLINE.findall(page.read_text()) for page in PAGES}
    assert found["README.md"], "the README's headline 'about $X/h running' is gone"
    for page, figures in found.items():
        for figure in figures:
            assert all(abs(float(figure) - rate) <= 0.01 for rate in rates), (page, figure, rates)


def test_no_other_page_quotes_a_price() -> None:
    table = {float(e["usd"]) for e in PRICES["items"] if e["usd"] is not None}
    for page in (p for p in PAGES if p.name != "cost.md"):
        figures = re.findall(r"\$(\d[\d,]*(?:\.\d+)?)", HEADLINE.sub("", page.read_text()))
        copied = [f for f in figures if float(f.replace(",", "")) in table]
        assert not copied, f"{page.name} copies the table's prices {copied}"
        if page.name not in OWN_FIGURES:
            assert not figures, (
                f"{page.name} quotes {figures}: prices live in prices.yml, figures in docs/cost.md"
            )


def test_no_role_keeps_a_price_of_its_own() -> None:
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")) + sorted(ROOT.glob("roles/*/vars/main.yml")):
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            if "price" in name:
                assert value == "{{ rig_prices }}", f"{path.relative_to(ROOT)}: {name} is not the price table"
