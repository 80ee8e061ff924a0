#!/usr/bin/python
"""Ansible module: one VPC firewall rule that admits listed source ranges to tagged VMs on one port."""

from __future__ import annotations

# ruff: noqa: E402 - Ansible modules keep DOCUMENTATION/EXAMPLES/RETURN above the imports.

DOCUMENTATION = r"""
---
module: gce_firewall
short_description: Create, update or delete one ingress firewall rule on Compute Engine
description:
  - Manages one ingress rule allowing TCP on the given ports from O(source_ranges) to VMs with
    O(target_tags), with the google-cloud-compute client. Used by gemma-rig to open the vLLM
    endpoint only when the user asks for it.
version_added: "0.1.0"
author: gemma-rig contributors !UNKNOWN
requirements:
  - google-cloud-compute >= 1.56
extends_documentation_fragment: [google_cloud, google_cloud.state]
options:
  name:
    description: Rule name.
    type: str
    required: true
  network:
    description: VPC network name.
    type: str
    default: default
  ports:
    description: TCP ports to allow.
    type: list
    elements: str
    default: ["8000"]
  source_ranges:
    description:
      - CIDR ranges admitted, IPv4 or IPv6, each in canonical form (C(203.0.113.0/24), not
        C(203.0.113.7/24) or C(0203.0.113.0/24)). Required with O(state=present).
      - A range covering every address (prefix length 0 however it is written, V(0.0.0.0/0),
        V(::/0), V(0.0.0.0/00)) or broader than O(min_prefix_v4) / O(min_prefix_v6) is refused
        unless O(allow_world=true). An IPv4-mapped IPv6 range counts as IPv4.
      - Checked before any request is sent.
    type: list
    elements: str
    default: []
  min_prefix_v4:
    description: The broadest IPv4 range admitted, as a prefix length (V(8) admits a /8, refuses a /7).
    type: int
    default: 8
  min_prefix_v6:
    description: The broadest IPv6 range admitted, as a prefix length.
    type: int
    default: 32
  allow_world:
    description: Admit ranges of any size, the whole internet included. Say so only on purpose.
    type: bool
    default: false
  validate_only:
    description: Check the arguments (O(source_ranges) above all) and return; no request is sent.
    type: bool
    default: false
  target_tags:
    description:
      - Network tags of the VMs the rule applies to.
      - An empty list (the default) means the rule applies to every instance in the network.
      - Emptying the list of an existing rule replaces the rule whole (C(firewalls.update)), as a
        patch cannot send an empty list; what the module does not manage (priority, logging,
        source tags, disabled) is carried over from the rule as it stands.
    type: list
    elements: str
    default: []
  description:
    description: Rule description.
    type: str
    default: Managed by gemma-rig
  operation_timeout:
    description: Seconds to wait for the operation.
    type: int
    default: 300
"""

EXAMPLES = r"""
- name: Admit the office to the vLLM endpoint
  gce_firewall:
    project: my-project
    name: gemma-rig-endpoint
    source_ranges: [203.0.113.0/24]
    target_tags: [gemma-rig]
"""

RETURN = r"""
rule:
  description: The rule as it stands (name, network, ports, source_ranges, target_tags), null when absent.
  returned: always
  type: dict
"""

import ipaddress
import json
from typing import Any

from ansible.module_utils.basic import missing_required_lib
from ansible.module_utils.gce_client import (
    HAS_GOOGLE,
    IMPORT_ERROR,
    PRESENT_OR_ABSENT,
    cloud_module,
    make_clients,
)
from ansible.module_utils.gce_errors import GceError, exception_to_error
from ansible.module_utils.gce_operations import call_and_wait, get_or_none
from ansible.module_utils.gce_retry import make_retry


def range_error(text: str, min_prefix_v4: int, min_prefix_v6: int, allow_world: bool) -> str | None:
    """Why ``text`` may not be a source range, or None. Python's ipaddress decides what it means."""
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return f"source range {text!r} is not an IPv4 or IPv6 CIDR range"
    version, prefix, floor = net.version, net.prefixlen, min_prefix_v4 if net.version == 4 else min_prefix_v6
    if net.version == 6 and net.network_address.ipv4_mapped is not None and prefix >= 96:
        version, prefix, floor = 4, prefix - 96, min_prefix_v4  # ::ffff:0.0.0.0/96 is all of IPv4
    if prefix == 0 and not allow_world:
        return (
            f"source range {text!r} is every IPv{version} address: it would open the endpoint to the "
            "whole internet; list your ranges (or set allow_world / gce_endpoint_allow_world: true)"
        )
    if prefix < floor and not allow_world:
        return (
            f"source range {text!r} is broader than /{floor}, the broadest IPv{version} range allowed "
            f"(min_prefix_v{version} / gce_endpoint_min_prefix_v{version})"
        )
    if str(net) != text:
        # One spelling per range, so the firewall rule, the unit's IPAddressAllow and systemd's
        # own listing of it compare as plain text.
        return f"source range {text!r} is not in canonical form: write {str(net)!r}"
    return None


def summarize(rule: dict[str, Any] | None) -> dict[str, Any]:
    """The compared fields of a rule (REST JSON)."""
    if not rule:
        return {}
    ports = sorted(p for a in rule.get("allowed") or [] for p in a.get("ports") or [])
    return {
        "name": rule.get("name"),
        "network": (rule.get("network") or "").rsplit("/", 1)[-1],
        "ports": ports,
        "source_ranges": sorted(rule.get("sourceRanges") or []),
        "target_tags": sorted(rule.get("targetTags") or []),
    }


# The rule's fields this module sets (REST JSON names); a firewalls.update carries every other one
# over from the rule as it stands, since a PUT resets whatever its body leaves out.
OWNED = ("name", "description", "network", "direction", "allowed", "sourceRanges", "targetTags")
OUTPUT_ONLY = ("kind", "id", "creationTimestamp", "selfLink")


def emptied(current: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether a list the rule has is wanted empty: the client writes no empty list, so a merge
    patch would leave the old values in place, and only a whole-rule update clears them."""
    return any(
        current.get(key) and not wanted[field]
        for key, field in (("targetTags", "target_tags"), ("sourceRanges", "source_ranges"))
    )


def replacement(compute_v1: Any, current: dict[str, Any], resource: Any) -> Any:
    """The whole rule for firewalls.update: the module's fields from ``resource``, the rest as it stands."""
    body = {k: v for k, v in current.items() if k not in OWNED and k not in OUTPUT_ONLY}
    # to_json writes every list the resource leaves unset as []: only the owned ones are taken.
    owned = json.loads(compute_v1.Firewall.to_json(resource, use_integers_for_enums=False))
    body.update({k: owned[k] for k in OWNED if k in owned})
    return compute_v1.Firewall.from_json(json.dumps(body))


def main() -> None:
    spec = dict(
        name={"type": "str", "required": True},
        state=PRESENT_OR_ABSENT,
        network={"type": "str", "default": "default"},
        ports={"type": "list", "elements": "str", "default": ["8000"]},
        source_ranges={"type": "list", "elements": "str", "default": []},
        target_tags={"type": "list", "elements": "str", "default": []},
        description={"type": "str", "default": "Managed by gemma-rig"},
        operation_timeout={"type": "int", "default": 300},
        min_prefix_v4={"type": "int", "default": 8},
        min_prefix_v6={"type": "int", "default": 32},
        allow_world={"type": "bool", "default": False},
        validate_only={"type": "bool", "default": False},
    )
    module = cloud_module(spec)
    p = module.params
    # Every check before any client exists, so a refused range sends no request at all.
    if not 0 <= p["min_prefix_v4"] <= 32 or not 0 <= p["min_prefix_v6"] <= 128:
        module.fail_json(msg="min_prefix_v4 must be 0-32 and min_prefix_v6 0-128")
    if p["state"] == "present" and not p["source_ranges"]:
        module.fail_json(msg="source_ranges must list the CIDR ranges to admit")
    for text in p["source_ranges"]:
        error = range_error(text, p["min_prefix_v4"], p["min_prefix_v6"], p["allow_world"])
        if error:
            module.fail_json(msg=error, source_range=text)
    if p["validate_only"]:
        module.exit_json(changed=False, source_ranges=p["source_ranges"])
    if not HAS_GOOGLE:
        module.fail_json(msg=missing_required_lib("google-cloud-compute"), exception=str(IMPORT_ERROR))
    from google.cloud import compute_v1

    try:
        clients = make_clients(p["auth_kind"], p["service_account_file"], p["api_endpoint"])
    except ValueError as err:  # credentials: raised before any request
        module.fail_json(msg=str(err), error_kind="auth")
    retry = make_retry()
    try:
        current = get_or_none(clients.firewalls.get, p["project"], retry, firewall=p["name"])
        before = summarize(current)
        wanted: dict[str, Any] = {}
        if p["state"] == "present":
            wanted = {
                "name": p["name"],
                "network": p["network"],
                "ports": sorted(p["ports"]),
                "source_ranges": sorted(p["source_ranges"]),
                "target_tags": sorted(p["target_tags"]),
            }
        changed = before != wanted
        if changed and not module.check_mode:
            if wanted:
                resource = compute_v1.Firewall(
                    name=p["name"],
                    description=p["description"],
                    network=f"projects/{p['project']}/global/networks/{p['network']}",
                    direction="INGRESS",
                    allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=wanted["ports"])],
                    source_ranges=wanted["source_ranges"],
                    target_tags=wanted["target_tags"],
                )
                if current and emptied(current, wanted):
                    call, kwargs = (
                        clients.firewalls.update_unary,
                        {
                            "firewall": p["name"],
                            "firewall_resource": replacement(compute_v1, current, resource),
                        },
                    )
                elif current:
                    call, kwargs = (
                        clients.firewalls.patch_unary,
                        {"firewall": p["name"], "firewall_resource": resource},
                    )
                else:
                    call, kwargs = clients.firewalls.insert_unary, {"firewall_resource": resource}
            else:
                call, kwargs = clients.firewalls.delete_unary, {"firewall": p["name"]}
            call_and_wait(clients, call, p["project"], None, p["operation_timeout"], retry, **kwargs)
    except GceError as err:
        module.fail_json(msg=str(err), error_kind=err.kind)
    except Exception as exc:
        module.fail_json(msg=str(exception_to_error(exc, p["project"])))
    module.exit_json(changed=changed, rule=wanted or None, diff={"before": before, "after": wanted})


if __name__ == "__main__":
    main()
