"""Every role validates its input first: a bad variable fails before any task runs, naming it.

For each role in roles/, one option from its ``meta/argument_specs.yml`` gets a value of the
wrong kind (not a number, not a boolean, not one of the choices); the role must fail at
argument validation, name the variable, and run none of its own tasks.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

ROLES = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))
# A value each kind of option must refuse.
BAD_BY_TYPE: dict[str, Any] = {
    "int": "not-a-number",
    "bool": "perhaps",
    "float": "not-a-float",
    "dict": "not-a-dict",
}


def bad_option(role: str) -> tuple[str, Any]:
    """An option of ``role`` and a value its argument spec must refuse."""
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options: dict[str, dict] = spec["argument_specs"]["main"].get("options", {})
    # The role's own variables first: a shared one (rig_models) feeds other roles' defaults too.
    ordered = sorted(options.items(), key=lambda item: not item[0].startswith(f"{role}_"))
    for name, opt in ordered:
        if opt.get("choices"):
            return name, "not-one-of-the-choices"
    for name, opt in ordered:
        if opt.get("type") in BAD_BY_TYPE:
            return name, BAD_BY_TYPE[opt["type"]]
    raise AssertionError(f"role {role} has no option whose bad value can be told apart")


@pytest.fixture(scope="module")
def validation_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, tuple[str, Any]]]:
    """One ansible-playbook run: each role on its own local host, with one bad value."""
    tmp = tmp_path_factory.mktemp("specs")
    bad = {role: bad_option(role) for role in ROLES}
    inventory = tmp / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    hosts = {
        f"spec-{role}": {
            "ansible_connection": "local",
            "ansible_python_interpreter": str(VENV_BIN / "python"),
            "rig_model": "tiny-emb4",
            "rig_platform": "local",
            "spec_role": role,
            # The bad value as a host variable: validation covers inventory values, not only params.
            bad[role][0]: bad[role][1],
        }
        for role in ROLES
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    # One play for all roles: a play whose every host fails would end the whole run.
    plays = [
        {
            "name": "bad input",
            "hosts": "all",
            "gather_facts": False,
            "tasks": [{"name": "role", "ansible.builtin.include_role": {"name": "{{ spec_role }}"}}],
        }
    ]
    playbook = tmp / "play.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.default",
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
    }
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode != 0, "every play has a bad variable, yet the run passed"
    assert proc.stdout.lstrip().startswith("{"), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout), bad


@pytest.mark.parametrize("role", ROLES)
def test_bad_variable_fails_first_naming_it(role: str, validation_run: tuple[dict, dict]) -> None:
    """The role's first task is argument validation; it fails naming the variable; nothing else runs."""
    report, bad = validation_run
    name, value = bad[role]
    host = f"spec-{role}"
    (play,) = report["plays"]
    ran = [t for t in play["tasks"] if host in t["hosts"] and t["task"]["name"] != "role"]
    assert ran, f"no task ran for {role}"
    first = ran[0]["hosts"][host]
    assert first.get("failed"), f"{role}: {name}={value!r} was accepted: {first}"
    assert "argument" in ran[0]["task"]["name"].lower(), ran[0]["task"]["name"]
    assert name in first["msg"], first["msg"]
    assert len(ran) == 1, f"{role} ran tasks after failing validation: {[t['task']['name'] for t in ran]}"


def test_every_role_has_an_argument_spec() -> None:
    """No role escapes validation by lacking a spec."""
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())
    assert roles == ROLES, f"roles without meta/argument_specs.yml: {sorted(set(roles) - set(ROLES))}"


def spec_options(options: dict[str, dict], where: str) -> list[tuple[str, dict]]:
    """Every option under ``options``, suboptions included, each with where it sits."""
    found = []
    for name, opt in options.items():
        found.append((f"{where}.{name}", opt))
        found += spec_options(opt.get("options") or {}, f"{where}.{name}")
    return found


def test_specs_describe_without_restating_values() -> None:
    """A value is written once, in the role's defaults/main.yml (or group_vars): a spec's ``default:``
    would be a second copy to keep equal. A spec says what an option is (type, choices, required,
    description), never its value again."""
    restated = [
        f"roles/{role}: {where}"
        for role in ROLES
        for entry, body in yaml.safe_load(
            (ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text()
        )["argument_specs"].items()
        for where, opt in spec_options(body.get("options") or {}, entry)
        if "default" in opt
    ]
    assert not restated, (
        f"argument_specs with a default: (its value belongs in defaults/main.yml): {restated}"
    )


def test_good_defaults_pass_validation(tmp_path: Path) -> None:
    """The same check with the defaults passes for rig_host (the bad value above is what fails)."""
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.validate_argument_spec": {
                        "argument_spec": yaml.safe_load(
                            (ROOT / "roles/rig_host/meta/argument_specs.yml").read_text()
                        )["argument_specs"]["main"]["options"],
                        "provided_arguments": {
                            "rig_data_dir": "/srv/rig",
                            "rig_host_swap_enabled": False,
                            "rig_host_swap_size_mb": 16,
                        },
                    }
                }
            ],
        }
    ]
    playbook = tmp_path / "good.yml"
    playbook.write_text(yaml.safe_dump(play))
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
