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


LOOSE_TASKS = re.compile(r"ansible\.builtin\.(include|import)_tasks\b")


def test_playbooks_hold_entry_plays_only() -> None:
    """What a step does lives in a role, behind an argument spec: no playbook runs a loose tasks file."""
    assert not (ROOT / "playbooks" / "tasks").exists()
    loose = [p.name for p in ROOT.glob("playbooks/*.yml") if LOOSE_TASKS.search(p.read_text())]
    assert not loose, loose


def test_swap_steps_are_role_entry_points() -> None:
    """swap.yml's plays (after finding the VMs) and what the swap role hands the gateway role are
    entry points, each with its tasks file and argument spec."""
    steps = []
    for play in yaml.safe_load((ROOT / "playbooks" / "swap.yml").read_text())[1:]:
        steps += [(role["role"], "main") for role in play.get("roles", [])]
        for task in play.get("tasks", []):
            include = task["ansible.builtin.include_role"]
            steps.append((include["name"], include.get("tasks_from", "main")))
    assert steps == [("swap", "build"), ("gateway", "reload"), ("swap", "main"), ("gateway", "config")]
    for role, entry in [*steps, ("gateway", "drain"), ("gateway", "ready"), ("swap", "resolve")]:
        spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
        assert entry in spec["argument_specs"], (role, entry)
        assert (ROOT / "roles" / role / "tasks" / f"{entry}.yml").is_file(), (role, entry)
