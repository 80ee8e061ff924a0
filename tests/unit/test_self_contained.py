"""Roles are self-contained: nothing a role runs, copies or reads on the controller lies outside it,
under any variable name; no path in a playbook climbs out of playbooks/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.conftest import ROOT

# role_path/.., role_path | dirname, playbook_dir/.. and playbook_dir | dirname.
ESCAPE = re.compile(r"(role_path|playbook_dir)\s*(\}\})?\s*(/\.\.|\|\s*dirname|~\s*['\"]/\.\.)")
# What leads out of a role once its variables are written out: the project's or the play's
# folders, a parent directory, or the checkout itself named by an absolute path.
OUT_OF_ROLE = re.compile(
    r"\b(rig_project_dir|playbook_dir|inventory_dir|inventory_file|ansible_config_file)\b|(^|[\s'\"/])\.\./|"
    + ESCAPE.pattern
    + "|"
    + re.escape(str(ROOT))
)
# The controller's build area (ignored, under build/): where roles put what they make, never what
# they run. It is not written out further.
BUILD_AREA = {"rig_controller_build_dir"}
WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def _strings(node: object) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def _definitions(node: object, defs: dict[str, list[str]]) -> None:
    """Every variable a YAML file defines (a vars file, or the vars: of its tasks), by name."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in {"vars", "set_fact", "ansible.builtin.set_fact"} and isinstance(value, dict):
                for name, val in value.items():
                    defs.setdefault(str(name), []).extend(_strings(val))
            _definitions(value, defs)
    elif isinstance(node, list):
        for item in node:
            _definitions(item, defs)


def variables(roles: Path, group_vars: Path) -> dict[str, list[str]]:
    """The definitions of every variable group_vars and the roles give, by name."""
    defs: dict[str, list[str]] = {}
    for path in [*group_vars.rglob("*.yml"), *roles.glob("*/defaults/*.yml"), *roles.glob("*/vars/*.yml")]:
        doc = yaml.safe_load(path.read_text()) or {}
        for name, value in doc.items() if isinstance(doc, dict) else ():
            defs.setdefault(str(name), []).extend(_strings(value))
    for path in roles.glob("*/tasks/**/*.yml"):
        _definitions(yaml.safe_load(path.read_text()), defs)
    return defs


def written_out(text: str, defs: dict[str, list[str]], seen: set[str] | None = None) -> str:
    """text and, recursively, the definitions of every variable it names."""
    seen = set() if seen is None else seen
    parts = [text]
    for name in WORD.findall(text):
        if name in defs and name not in seen and name not in BUILD_AREA:
            seen.add(name)
            parts += [written_out(d, defs, seen) for d in defs[name]]
    return "\n".join(parts)


def role_escapes(roles: Path, group_vars: Path) -> list[str]:
    """Each string of a role's tasks and handlers, and each template expression, that leads out."""
    defs = variables(roles, group_vars)
    found = []
    for path in sorted(roles.glob("*/*/**/*")):
        kind = path.relative_to(roles).parts[1]
        if kind in {"tasks", "handlers"} and path.suffix == ".yml":
            strings = list(_strings(yaml.safe_load(path.read_text())))
        elif kind == "templates" and path.is_file():
            strings = re.findall(r"\{[{%].*?[%}]\}", path.read_text(), flags=re.S)
        else:
            continue
        found += [
            f"{path.relative_to(roles)}: {s.strip()[:120]}"
            for s in strings
            if OUT_OF_ROLE.search(written_out(s, defs))
        ]
    return found


def test_no_path_leaves_a_role() -> None:
    assert len(list((ROOT / "roles").glob("*/tasks/*.yml"))) > 20, (
        "the scan found too few files: it is broken"
    )
    escapes = role_escapes(ROOT / "roles", ROOT / "inventory" / "group_vars")
    assert not escapes, (
        "paths out of their role, once its variables are written out (ship the file in the role's "
        "files/ or templates/, or run an installed package with python -m):\n" + "\n".join(escapes)
    )


def test_a_role_that_reaches_out_through_a_variable_is_caught(tmp_path: Path) -> None:
    """A fake role: what names a project path through a chain of variables fails; its own files, the
    build area and a path on the rig pass."""
    role = tmp_path / "roles" / "fake"
    (role / "tasks").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "defaults" / "main.yml").write_text(
        yaml.safe_dump({
            "fake_tools": "{{ fake_home }}/scripts",
            "fake_home": "{{ rig_project_dir }}",
            "fake_up": "{{ role_path }}/../other/files/x.py",
            "fake_out": "{{ rig_controller_build_dir }}/fake",
        })
    )  # fmt: skip
    tasks = [
        {"name": "reach", "ansible.builtin.command": {"argv": ["{{ fake_tools }}/x.sh"]}},
        {"name": "climb", "ansible.builtin.copy": {"src": "{{ fake_up }}", "dest": "/opt/x.py"}},
        {"name": "absolute", "ansible.builtin.copy": {"src": str(ROOT / "files" / "x"), "dest": "/opt/x"}},
        {
            "name": "own",
            "ansible.builtin.copy": {"src": "{{ role_path }}/files/x.py", "dest": "{{ fake_out }}/x"},
        },
        {"name": "rig", "ansible.builtin.slurp": {"src": "/etc/gemma-rig/tpu.env"}},
    ]
    (role / "tasks" / "main.yml").write_text(yaml.safe_dump(tasks))
    (tmp_path / "group_vars").mkdir()
    found = role_escapes(tmp_path / "roles", tmp_path / "group_vars")
    assert [f.split(": ", 1)[1] for f in found] == [
        "{{ fake_tools }}/x.sh",
        "{{ fake_up }}",
        str(ROOT / "files" / "x"),
    ], found


def test_no_path_leaves_the_playbooks() -> None:
    files = [p for p in ROOT.glob("playbooks/**/*") if p.suffix in {".yml", ".j2"}]
    assert len(files) > 20, "the scan found too few files: it is broken"
    escapes = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if ESCAPE.search(line)
    ]
    assert not escapes, "paths out of playbooks/ (use rig_project_dir):\n" + "\n".join(escapes)


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


def test_accuracy_play_only_runs_its_role() -> None:
    """What accuracy.yml does lives in roles/accuracy (argument specs, defaults); test_bench_role
    checks bench.yml the same way."""
    _, play = yaml.safe_load((ROOT / "playbooks" / "accuracy.yml").read_text())
    assert play["roles"] == [{"role": "accuracy"}] and "tasks" not in play and "vars" not in play
    spec = yaml.safe_load((ROOT / "roles" / "accuracy" / "meta" / "argument_specs.yml").read_text())
    assert set(spec["argument_specs"]["main"]["options"]) == set(
        yaml.safe_load((ROOT / "roles" / "accuracy" / "defaults" / "main.yml").read_text())
    ) - {"accuracy_env_file"}  # defaults to group_vars' rig_env_file, which a vLLM by hand lacks
