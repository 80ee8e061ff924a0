"""Roles are self-contained: no path in a role or playbook climbs out of its own folder."""

from __future__ import annotations

import re

import yaml

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


# The machine role of each platform and the tasks file each of its plays runs.
PLATFORM_PLAYS = {
    "provision_gce.yml": ("gce", None),
    "teardown_gce.yml": ("gce", "teardown"),
    "provision_gce_gateways.yml": ("gce", None),
    "teardown_gce_gateways.yml": ("gce", "teardown"),
    "provision_local.yml": ("local_rig", None),
    "teardown_local.yml": ("local_rig", "teardown"),
    "provision_tpu.yml": ("tpu", None),
    "teardown_tpu.yml": ("tpu", "teardown"),
}


def test_platform_plays_only_include_their_machine_role() -> None:
    """What a platform does lives in its role (argument specs, defaults), not inline in its plays."""
    for name, (role, tasks_from) in PLATFORM_PLAYS.items():
        (play,) = yaml.safe_load((ROOT / "playbooks" / name).read_text())
        (task,) = play["tasks"]
        include = task["ansible.builtin.include_role"]
        assert (include["name"], include.get("tasks_from")) == (role, tasks_from), name
        tasks = ROOT / "roles" / role / "tasks" / f"{tasks_from or 'main'}.yml"
        spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
        assert tasks.is_file() and (tasks_from or "main") in spec["argument_specs"], name
