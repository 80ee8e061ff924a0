"""Filter plugin: the vLLM flags a rig gets, the platform profile's with the host's changes on top."""

from __future__ import annotations

from collections.abc import Mapping

DOCUMENTATION = r"""
---
name: rig_flags
author: gemma-rig contributors !UNKNOWN
version_added: "0.1.0"
short_description: Merge a host's vLLM flags over the platform profile's, dropping null and false
description:
  - The one place where the platform profile's vLLM flags (C(rig_vllm_flags)) and a host's changes
    (C(rig_vllm_host_flags)) are merged. rig_config (tpu.env and its checks), vllm_service (the unit),
    bench.yml and the MCP server's capacity check (rig_mcp/capacity.py) all read the flags through it.
  - A host's flag replaces the profile's in its place; a flag only the host sets comes after the
    profile's, in the host's order. The order is the order vLLM gets them.
  - A flag whose value is C(null) or C(false) is dropped, unless O(drop=false).
options:
  _input:
    description: The platform profile's flags, C(rig_vllm_flags).
    type: dict
    required: true
  host:
    description: This host's changes, C(rig_vllm_host_flags).
    type: dict
    default: {}
  drop:
    description:
      - Drop the flags whose value is C(null) or C(false).
      - C(false) keeps them, for the checks that must see every name a host wrote (a mistyped name
        set to C(null) would otherwise drop nothing and say nothing).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: The flags tpu.env and the unit get
  ansible.builtin.debug:
    msg: "{{ rig_vllm_flags | rig_flags(rig_vllm_host_flags | default({})) }}"
"""

RETURN = r"""
_value:
  description: The merged flags, in order.
  type: dict
"""


def rig_flags(profile: Mapping, host: Mapping | None = None, drop: bool = True) -> dict:
    """``profile`` with ``host`` merged over it, in order; null and false drop a flag when ``drop``.

    False drops a flag as null does, so a host turns off a profile's switch (true) with false.
    """
    for what, value in (("rig_vllm_flags", profile), ("rig_vllm_host_flags", host or {})):
        if not isinstance(value, Mapping):
            raise TypeError(f"{what} must be a mapping of flag to value, got {type(value).__name__}")
    merged = {**profile, **(host or {})}
    if not drop:
        return merged
    return {k: v for k, v in merged.items() if v is not None and v is not False}


class FilterModule:
    """Ansible's entry point for the filters in this file."""

    def filters(self) -> dict:
        return {"rig_flags": rig_flags}
