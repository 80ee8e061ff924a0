"""The rig's own names and its port are written once, in inventory/group_vars/all/rig.yml.

rig_unit_name (the systemd unit), rig_service_user (the user vLLM runs as, and its group),
rig_helper_dir (the folder of the rig's tools) and rig_port: every role, playbook, template, rig
tool, inventory file and molecule scenario reads the variable; none writes the value again. Run
alone with ``pytest -m names_once``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.names_once

ONE_PLACE = ROOT / "inventory" / "group_vars" / "all" / "rig.yml"
NAMES = ("rig_unit_name", "rig_service_user", "rig_helper_dir", "rig_port")
SCANNED = ("roles", "playbooks", "inventory", "molecule")
# What the rig runs or reads: plays, templates, tools. Not prose (README.md), nor the pinned pip
# locks and package metadata, where `vllm` is the distribution's name.
KINDS = {".yml", ".yaml", ".j2", ".py", ".sh", ".cfg", ".conf", ".service", ""}
# A mapping key whose value is the distribution or role called `vllm`, not the unit or the user.
PACKAGE_KEYS = {"vllm_package"}
ROLE_KEYS = {"ansible.builtin.import_role", "ansible.builtin.include_role", "import_role", "include_role"}
# Files allowed to write a value again, each with its reason: (path, text of the hit) -> reason.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def values() -> dict[str, str]:
    """The four values as rig.yml defines them."""
    defined = yaml.safe_load(ONE_PLACE.read_text())
    return {name: str(defined[name]) for name in NAMES}


def patterns(v: dict[str, str]) -> list[tuple[str, re.Pattern[str]]]:
    """Text that writes one of the values as that value (not `vllm` the package or the role)."""
    unit, user = re.escape(v["rig_unit_name"]), re.escape(v["rig_service_user"])
    end = r"(?![\w.\-/])"
    found = [
        ("rig_helper_dir", re.compile(re.escape(v["rig_helper_dir"]))),
        ("rig_port", re.compile(rf"(?<![\w.]){re.escape(v['rig_port'])}(?![\w.])")),
        ("rig_unit_name", re.compile(rf"\b{unit}\.service\b(?!\.j2)")),
        ("rig_unit_name", re.compile(rf"(?:\s-u|--unit)[ =]{unit}{end}")),
        ("rig_unit_name", re.compile(rf"systemctl\s+(?:[\w-]+\s+){{0,3}}{unit}{end}")),
        ("rig_unit_name", re.compile(rf"""(?i)unit\w*\s*[:=]\s*["']{unit}["']""")),
        ("rig_unit_name", re.compile(rf"""\bdefault\s*=\s*["']{unit}["']""")),
    ]
    for name, value in (("rig_service_user", user),):
        found += [
            (name, re.compile(rf"\b(?:User|Group)={value}{end}")),
            (name, re.compile(rf"""(?:==|!=)\s*["']{value}["']""")),
            (name, re.compile(rf"\b{value}:{value}\b")),
            (name, re.compile(rf"\b(?:chown|getent passwd|getent group|id)\s+{value}{end}")),
            (name, re.compile(rf"""(?i)(?:user|group|owner)\w*\s*[:=]\s*["']{value}["']""")),
        ]
    return found


def scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in KINDS and ".egg-info" not in str(path):
                files.append(path)
    return files


def yaml_hits(node: Any, v: dict[str, str], parent: str = "") -> list[str]:
    """Mapping values that are exactly the unit name or the user (a role called vllm aside)."""
    names = {v["rig_unit_name"], v["rig_service_user"]}
    hits = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and value in names:
                role = key == "name" and parent in ROLE_KEYS
                if not role and key not in PACKAGE_KEYS:
                    hits.append(f"{key}: {value}")
            hits += yaml_hits(value, v, str(key))
    elif isinstance(node, list):
        for item in node:
            hits += yaml_hits(item, v, parent)
    return hits


def literal_hits() -> list[str]:
    v = values()
    found = []
    for path in scanned_files():
        rel = str(path.relative_to(ROOT))
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        lines = text.splitlines()
        if path == ONE_PLACE:
            lines = [line for line in lines if not line.startswith(tuple(f"{n}:" for n in NAMES))]
        for number, line in enumerate(lines, 1):
            for name, pattern in patterns(v):
                match = pattern.search(line)
                if match and (rel, match.group(0)) not in EXCEPTIONS:
                    found.append(f"{rel}:{number}: {match.group(0)!r} ({name})")
        if path.suffix in {".yml", ".yaml"} and path != ONE_PLACE:
            try:
                docs = list(yaml.safe_load_all(text))
            except yaml.YAMLError:
                continue
            found += [f"{rel}: {hit} (rig_unit_name or rig_service_user)" for hit in yaml_hits(docs, v)]
    return found


def test_the_names_and_the_port_are_written_once() -> None:
    """A second copy of a value drifts: each place reads the variable instead."""
    hits = literal_hits()
    assert not hits, "write the variable, not its value:\n" + "\n".join(hits)


def test_the_scan_finds_each_kind_of_copy(tmp_path: Path) -> None:
    """The patterns catch the forms a copy takes, and leave `vllm` the package and the role alone."""
    v = values()
    unit, user, helper, port = (v[n] for n in NAMES)
    copies = [
        f"ExecStart=journalctl -u {unit} -n 5",
        f"systemctl show -p ExecStartPre {unit}",
        f"systemd-analyze security {unit}.service",
        f'DEFAULT_UNIT = "{unit}"',
        f'parser.add_argument("--unit", default="{unit}")',
        f"User={user}",
        f"failed_when: _x.stat.pw_name != '{user}'",
        f"checker: {helper}/clamp-check",
        f"url: http://127.0.0.1:{port}/health",
    ]
    for line in copies:
        assert any(p.search(line) for _, p in patterns(v)), line
    tasks = yaml.safe_load(
        f"""
- ansible.builtin.systemd_service: {{name: {unit}, state: started}}
- ansible.builtin.user: {{name: {user}, group: {user}}}
- ansible.builtin.import_role: {{name: vllm}}
- ansible.builtin.set_fact: {{vllm_package: vllm}}
"""
    )
    assert len(yaml_hits(tasks, v)) == 3, yaml_hits(tasks, v)
    innocent = [
        "vllm_package: vllm",
        "src: vllm.service.j2",
        "s = importlib.util.find_spec('vllm')",
        'print({n: metadata.version(n) for n in ("vllm", "torch")})',
        "python -m vllm.entrypoints.openai.api_server --port 18000",
    ]
    for line in innocent:
        assert not any(p.search(line) for _, p in patterns(v)), line
