"""The rig's data directory is written once: rig_data_dir in inventory/group_vars/all/rig.yml.

Everything on the data disk derives from it (rig_venv_dir, rig_models_dir, the roles' own
variables); the roles read those without a fallback literal, and their argument specs say they
are required, so a run without them fails first, naming them.

The scan covers what the rigs run: roles/, playbooks/, inventory/ and the top-level playbooks.
It leaves out comments (parsed away) and what states an expected value on purpose: tests/ and
molecule/ (their verify plays check the rendered paths against the literal), the golden files,
docs/ and the modules' EXAMPLES (library/turing_clamp.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

DATA_DIR = "/opt1"


def scalars(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a parsed YAML document, keys included, with its path."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from scalars(key, where)
            yield from scalars(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from scalars(value, f"{where}[{i}]")
    elif isinstance(node, str):
        yield where, node


def sources() -> list[Path]:
    found = [
        *ROOT.glob("*.yml"),
        *(p for d in ("roles", "playbooks", "inventory") for p in ROOT.glob(f"{d}/**/*")),
    ]
    return sorted(p for p in found if p.suffix in {".yml", ".yaml", ".j2"} and p.is_file())


def test_the_data_dir_is_written_in_one_place() -> None:
    files = sources()
    assert len(files) > 40, "the scan found too few files: it is broken"
    found = []
    for path in files:
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        if path.suffix == ".j2":
            found += [f"{rel}: {line.strip()}" for line in text.splitlines() if DATA_DIR in line]
            continue
        for doc in yaml.safe_load_all(text):
            found += [f"{rel}:{where}" for where, value in scalars(doc) if DATA_DIR in value]
    assert found == ["inventory/group_vars/all/rig.yml:.rig_data_dir"], "\n".join(found)


def test_no_role_or_playbook_falls_back_to_its_own_value() -> None:
    """`rig_x | default(...)` restates rig_x's definition: the roles read the shared values as they are."""
    shared = ("rig_data_dir", "rig_venv_dir", "rig_models_dir", "rig_current_model_link")
    found = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in sources()
        for line in p.read_text().splitlines()
        if any(f"{name} | default(" in line.replace("  ", " ") for name in shared)
    ]
    assert not found, "\n".join(found)


def spec_options(role: str) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]


ROLES_NEEDING = {
    "rig_host": ["rig_data_dir"],
    "vllm": ["rig_data_dir", "rig_venv_dir"],
    "vllm_service": ["rig_data_dir", "rig_venv_dir"],
    "checkpoint": ["rig_current_model_link", "rig_models_dir", "rig_venv_dir"],
}


@pytest.mark.parametrize("role", sorted(ROLES_NEEDING))
def test_argument_specs_require_the_shared_paths(role: str) -> None:
    options = spec_options(role)
    assert [name for name in ROLES_NEEDING[role] if options[name].get("required")] == ROLES_NEEDING[role]


def test_a_run_without_the_data_dir_fails_naming_it(tmp_path: Path) -> None:
    """As a role starts, with only its own defaults: validation refuses the missing shared paths."""
    tasks = [
        {
            "name": f"validate {role}",
            "ansible.builtin.validate_argument_spec": {
                "argument_spec": spec_options(role),
                "provided_arguments": {},
            },
            "ignore_errors": True,
            "register": f"_spec_{role}",
        }
        for role in sorted(ROLES_NEEDING)
    ]
    tasks.append(
        {
            "name": "Write what validation said",
            "ansible.builtin.copy": {
                "content": "{{ {"
                + ", ".join(f"'{role}': _spec_{role}.msg" for role in sorted(ROLES_NEEDING))
                + "} | to_json }}",
                "dest": str(tmp_path / "said.json"),
                "mode": "0644",
            },
        }
    )
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
         "-e", f"ansible_python_interpreter={VENV_BIN / 'python'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = yaml.safe_load((tmp_path / "said.json").read_text())
    for role, needed in ROLES_NEEDING.items():
        for name in needed:
            assert name in said[role], f"{role}: {said[role]}"
