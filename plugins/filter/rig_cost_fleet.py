"""Filter plugin: the fleet's cost totals from the rigs' reports (library/rig_cost.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DOCUMENTATION = r"""
---
name: rig_cost_fleet
author: gemma-rig contributors !UNKNOWN
version_added: "0.1.0"
short_description: Add up the rigs' cost reports into the fleet's
description:
  - The one place the fleet's totals are made (playbooks/cost.yml; the MCP C(cost) tool reads them
    from there). Each total is the sum of the rigs' figures as rounded in their reports, so the
    rows a reader adds up give the total shown.
options:
  _input:
    description: The C(report) of each rig, as rig_cost returns it.
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: The fleet's totals
  ansible.builtin.debug:
    msg: "{{ reports | rig_cost_fleet }}"
"""

RETURN = r"""
_value:
  description: rigs, usd_per_hour_now, month_to_date_usd, projected_month_usd, idle_saved_usd, and
    all_measured (every rig's hours measured and every price known).
  type: dict
"""

_MONEY = ("month_to_date_usd", "projected_month_usd", "idle_saved_usd")


def rig_cost_fleet(reports: Sequence[Mapping]) -> dict:
    """The fleet's totals of ``reports``."""
    if not isinstance(reports, Sequence) or not all(isinstance(r, Mapping) for r in reports):
        raise TypeError("rig_cost_fleet takes a list of rig_cost reports")
    totals: dict = {key: round(sum(r[key] for r in reports), 2) for key in _MONEY}
    totals["usd_per_hour_now"] = round(sum(r["usd_per_hour_now"] for r in reports), 4)
    totals["rigs"] = len(reports)
    totals["all_measured"] = all(r["hours_run_is"] == "measured" and not r["unpriced"] for r in reports)
    return totals


class FilterModule:
    """Ansible's entry point for the filters in this file."""

    def filters(self) -> dict:
        return {"rig_cost_fleet": rig_cost_fleet}
