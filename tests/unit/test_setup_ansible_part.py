"""The virtualenv's Ansible part (scripts/setup.sh ANSIBLE_PACKAGES) is all that Ansible needs.

up.sh provisions and configures the rig from a virtualenv that holds only this part while the rest
installs, so a requirement missing from the list would break ``ansible-playbook`` there and only
there. The closure is computed from the installed distributions' own metadata.
"""

from __future__ import annotations

import re
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

_SETUP = ROOT / "scripts" / "setup.sh"


def _listed() -> set[str]:
    match = re.search(r"^ANSIBLE_PACKAGES=\(([^)]*)\)", _SETUP.read_text(), re.MULTILINE)
    assert match, "scripts/setup.sh defines no ANSIBLE_PACKAGES=(...)"
    return {canonicalize_name(name) for name in match.group(1).split()}


def _closure(root: str) -> set[str]:
    """``root`` and every distribution it requires, transitively (markers evaluated here, no extras)."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _pinned() -> set[str]:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    return {
        canonicalize_name(line.split("==")[0]) for line in lines if "==" in line and not line.startswith("#")
    }


def test_the_ansible_part_is_the_whole_closure_of_ansible() -> None:
    closure = _closure("ansible")
    assert "ansible-core" in closure and "jinja2" in closure, f"the closure looks wrong: {sorted(closure)}"
    assert _listed() == closure, (
        f"missing from ANSIBLE_PACKAGES: {sorted(closure - _listed())}; "
        f"not required by ansible: {sorted(_listed() - closure)}"
    )


def test_each_package_of_the_ansible_part_is_pinned_in_the_lock() -> None:
    assert _listed() <= _pinned(), f"not in requirements.lock: {sorted(_listed() - _pinned())}"
