"""Roles are self-contained: no path in a role or playbook climbs out of its own folder."""

from __future__ import annotations

import re

from tests.conftest import ROOT

# role_path/.., role_path | dirname, playbook_dir/.. and playbook_dir | dirname.
ESCAPE = re.compile(r"(role_path|playbook_dir)\s*(\}\})?\s*(/\.\.|\|\s*dirname|~\s*['\"]/\.\.)")


def test_no_path_leaves_a_role_or_the_playbooks() -> None:
    files = [
        p for p in (*ROOT.glob("roles/**/*"), *ROOT.glob("playbooks/**/*")) if p.suffix in {".yml", ".j2"}
    ]
    assert len(files) > 20, "the scan found too few files: it is broken"
    escapes = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if ESCAPE.search(line)
    ]
    assert not escapes, (
        "paths out of their folder (ship the file in the role, or use rig_project_dir):\n"
        + "\n".join(escapes)
    )
