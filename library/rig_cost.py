#!/usr/bin/python
"""Ansible module: what one rig costs, read from the Compute Engine or Cloud TPU API."""

# ruff: noqa: E402 - Ansible modules keep DOCUMENTATION/EXAMPLES/RETURN above the imports.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rig_cost
short_description: Report what a Compute Engine or Cloud TPU rig costs this month
version_added: "0.1.0"
author: gemma-rig contributors !UNKNOWN
description:
  - Reads the rig's VM (Compute Engine, with its disks) or TPU node from the API, and prices it with
    the dated price table O(prices) (C(rig_prices), inventory/group_vars/all/prices.yml).
  - Reports the state, machine type, accelerator and disks; the price per hour running and stopped;
    the hours run this billing month (US Pacific time, as Cloud Billing's), the month-to-date cost
    and the projection to the month's end at the rate of now; and what an idle stop saved.
  - The hours come from the API's timestamps only (creationTimestamp, lastStartTimestamp,
    lastStopTimestamp; a node's createTime). RV(report.hours_run_is) says whether they are
    C(measured), a C(lower bound) (runs before the last start cannot be read back), or an
    C(upper bound) (a TPU node's createTime counts the minutes it was being made).
  - Only reads are sent. A value the API returns in an unexpected shape (a machine type URL, a
    timestamp that is not RFC 3339) fails the task with one line naming it; no figure is made.
  - docs/cost.md says how to read the report.
extends_documentation_fragment: [google_cloud]
options:
  platform:
    description: V(gce) for a Compute Engine VM, V(tpu) for a Cloud TPU node.
    type: str
    choices: [gce, tpu]
    required: true
  name:
    description: The VM's or node's name (the inventory host name).
    type: str
    required: true
  zones:
    description: The zones the rig may be in; the first that holds it is reported.
    type: list
    elements: str
    required: true
  data_disk:
    description:
      - The data disk that outlives a Compute Engine VM. Reported (and priced) when the VM is gone
        and the disk is left, as a teardown leaves it.
    type: str
  provisioning_model:
    description: How the TPU node was obtained (the node does not say flex-start); prices it.
    type: str
    choices: [flex-start, spot, on-demand]
    default: on-demand
  prices:
    description: The price table, C(rig_prices) (docs/cost.md).
    type: dict
    required: true
  now:
    description:
      - The moment to report at, RFC 3339 with an offset; default the controller's clock.
      - For a report of a past moment, and for tests.
    type: str
attributes:
  check_mode:
    description: The module only reads; check mode reports the same.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
"""

EXAMPLES = r"""
- name: What the T4 rig costs
  rig_cost:
    platform: gce
    project: my-project
    zones: [us-central1-a, us-central1-b]
    name: rig-t4
    data_disk: rig-t4-data
    prices: "{{ rig_prices }}"
  register: cost
  delegate_to: localhost

- name: Say it
  ansible.builtin.debug:
    msg: "{{ cost.report.month_to_date_usd }} USD this month, {{ cost.report.usd_per_hour_now }} USD/h now"
"""

RETURN = r"""
report:
  description: The rig's cost report (docs/cost.md).
  returned: success
  type: dict
  contains:
    rig: {description: The rig's name., type: str, returned: success}
    platform: {description: V(gce) or V(tpu)., type: str, returned: success}
    zone: {description: Where it is (the first zone of O(zones) when it is nowhere)., type: str, returned: success}
    state:
      description: The VM's status or the node's state as the API gives it; C(ABSENT) when there is none.
      type: str
      returned: success
    machine_type: {description: The machine type or TPU accelerator type., type: str, returned: success}
    accelerator: {description: The GPUs (C(1 x nvidia-tesla-t4)) or TPU chips., type: str, returned: success}
    provisioning_model: {description: 'standard, spot, flex-start or on-demand.', type: str, returned: success}
    disks:
      description: The disks that bill (name, type, size_gb, usd_per_month).
      type: list
      elements: dict
      returned: success
    usd_per_hour_running: {description: Price per hour while it runs., type: float, returned: success}
    usd_per_hour_stopped: {description: Price per hour while stopped (its disks)., type: float, returned: success}
    usd_per_hour_now: {description: The rate of its state now., type: float, returned: success}
    hours_run: {description: Hours it ran this billing month., type: float, returned: success}
    hours_run_is: {description: 'C(measured), C(lower bound) or C(upper bound).', type: str, returned: success}
    hours_unknown:
      description: Hours this month in which earlier runs may have happened that the API no longer shows.
      type: float
      returned: success
    month_to_date_usd: {description: Cost this month so far., type: float, returned: success}
    projected_month_usd: {description: The month-to-date cost plus the rate of now to the month's end., type: float, returned: success}
    stop_reason:
      description:
        - Why a stopped VM stopped. The VM's C(rig-stop-reason) label when it has one; else the newest zone
          operation that stopped it since its last start (C(compute.zoneOperations.list)), as
          C(guest) (it powered itself off, as the idle stop does), C(user) (a stop through the API) or
          C(preempted); empty when none is known (the API keeps operations for a limited time).
      type: str
      returned: success
    idle_saved_usd:
      description:
        - Running price (without disks) times the hours stopped this month, when the stop reason is
          C(idle) or C(guest); else 0.
      type: float
      returned: success
    unpriced: {description: What the price table has no price for (left out of every figure)., type: list, elements: str, returned: success}
    unconfirmed: {description: Prices used that the table marks unconfirmed., type: list, elements: str, returned: success}
    still_costs: {description: One line per thing that bills now., type: list, elements: str, returned: success}
    price_table_as_of: {description: The price table's date., type: str, returned: success}
    month_start: {description: The billing month's first instant., type: str, returned: success}
    now: {description: The moment reported., type: str, returned: success}
"""

from datetime import UTC, datetime
from typing import Any

from ansible.module_utils.basic import missing_required_lib
from ansible.module_utils.gce_client import HAS_GOOGLE, IMPORT_ERROR, cloud_module, make_clients, to_dict
from ansible.module_utils.gce_errors import GceError, exception_to_error
from ansible.module_utils.gce_operations import get_or_none
from ansible.module_utils.gce_retry import make_retry
from ansible.module_utils.rig_cost import (
    CostError,
    gce_report,
    instance_id,
    parse_time,
    resource_name,
    tpu_report,
)


def read_gce(
    p: dict[str, Any],
) -> tuple[str, dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """(zone, the VM or None, the disks that bill for it, its zone operations when it is stopped)."""
    clients = make_clients(p["auth_kind"], p["service_account_file"], p["api_endpoint"])
    retry = make_retry()
    for zone in p["zones"]:
        inst = get_or_none(clients.instances.get, p["project"], retry, zone=zone, instance=p["name"])
        if inst is not None:
            names = [resource_name(d.get("source"), "disks", "disk source") for d in inst.get("disks") or []]
            disks = [get_or_none(clients.disks.get, p["project"], retry, zone=zone, disk=n) for n in names]
            ops = []
            if inst.get("status") == "TERMINATED":  # what stopped it: the idle stop, a user, a preemption
                query = f'targetId = "{instance_id(inst)}"'
                request = {"project": p["project"], "zone": zone, "filter": query}
                pager = clients.zone_operations.list(request=request, retry=retry)
                ops = [to_dict(op) for op in pager]
            return zone, inst, [d for d in disks if d], ops
    # No VM: the data disk a teardown kept is what still bills, in whichever zone it is.
    for zone in p["zones"] if p["data_disk"] else []:
        disk = get_or_none(clients.disks.get, p["project"], retry, zone=zone, disk=p["data_disk"])
        if disk is not None:
            return zone, None, [disk], []
    return p["zones"][0], None, [], []


def read_tpu(p: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    from ansible.module_utils.tpu_api import make_api

    api = make_api(
        dict(p, retry_initial_delay=1.0, retry_deadline=120, operation_timeout=60, poll_interval=1)
    )
    for zone in p["zones"]:
        node = api.get_node(zone, p["name"])
        if node is not None:
            return zone, node
    return p["zones"][0], None


def main() -> None:
    module = cloud_module(
        {
            "platform": {"type": "str", "required": True, "choices": ["gce", "tpu"]},
            "name": {"type": "str", "required": True},
            "zones": {"type": "list", "elements": "str", "required": True},
            "data_disk": {"type": "str"},
            "provisioning_model": {
                "type": "str",
                "default": "on-demand",
                "choices": ["flex-start", "spot", "on-demand"],
            },
            "prices": {"type": "dict", "required": True},
            "now": {"type": "str"},
        }
    )
    p = module.params
    if not HAS_GOOGLE:
        module.fail_json(msg=missing_required_lib("google-cloud-compute"), exception=str(IMPORT_ERROR))
    try:
        now = parse_time(p["now"], "now") if p["now"] else datetime.now(UTC)
        if p["platform"] == "gce":
            zone, inst, disks, ops = read_gce(p)
            report = gce_report(p["name"], zone, inst, disks, p["prices"], now, ops)
        else:
            zone, node = read_tpu(p)
            report = tpu_report(p["name"], zone, node, p["provisioning_model"], p["prices"], now)
    except CostError as err:
        module.fail_json(msg=f"{p['name']}: {err}")
    except ValueError as err:  # credentials: raised before any request
        module.fail_json(msg=str(err), error_kind="auth")
    except GceError as err:
        module.fail_json(msg=str(err), error_kind=err.kind)
    except Exception as exc:
        module.fail_json(msg=str(exception_to_error(exc, p["project"])))
    module.exit_json(changed=False, report=report)


if __name__ == "__main__":
    main()
