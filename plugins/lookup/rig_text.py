"""Lookup plugin: a variable's text as it was given, never templated (a user's prompt is data)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: rig_text
author: gemma-rig contributors !UNKNOWN
version_added: "0.1.0"
short_description: A variable's text as it was given, never rendered as a template
description:
  - Returns the value of one variable exactly as it was set (C(-e name=...), C(-e @file), the
    inventory), without rendering it, so a prompt that contains C({{), C({%) or C({#) is sent as typed.
  - ansible-core 2.19 trusts C(-e) values as templates, so reading such a variable the ordinary
    way would render it; this lookup reads the variable before rendering and returns it as plain,
    untrusted text, which nothing later renders either.
  - Only text is accepted; any other type fails with one line naming the variable.
options:
  _terms:
    description: The variable's name (one).
    required: true
    type: str
  default:
    description: What to return when the variable is not set (rendered by the caller as usual).
    type: str
"""

EXAMPLES = r"""
- name: Send the user's prompt as typed
  ansible.builtin.debug:
    msg: "{{ lookup('rig_text', 'prompt', default=rig_smoke_prompt) }}"
"""

RETURN = r"""
_raw:
  description: The variable's text, untrusted (never rendered).
  type: list
  elements: str
"""

from ansible.errors import AnsibleLookupError  # noqa: E402  (Ansible plugins put their documentation first)
from ansible.plugins.lookup import LookupBase  # noqa: E402


class LookupModule(LookupBase):
    """Read one variable's raw text."""

    def run(self, terms, variables=None, **kwargs):
        if len(terms) != 1 or not isinstance(terms[0], str):
            raise AnsibleLookupError(f"rig_text takes one variable name, got {terms!r}")
        name = terms[0]
        # `variables` holds the values as set, before any rendering (the vars lookup renders them
        # itself); that is the point of this plugin.
        if name not in (variables or {}):
            if "default" in kwargs:
                return [kwargs["default"]]
            raise AnsibleLookupError(f"rig_text: no variable named {name!r}")
        value = variables[name]
        if not isinstance(value, str):
            raise AnsibleLookupError(f"rig_text: {name} must be text, got {type(value).__name__}")
        # A copy through bytes is a plain str: it carries none of the value's tags, trust included.
        return [value.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")]
