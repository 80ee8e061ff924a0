"""Root's pip never reads from a directory the vllm user can write.

vLLM runs as the vllm user and may write its tmp and cache directories; root runs pip (the vllm
role's installs, a shell's pip through /etc/profile.d and /etc/pip.conf). A directory root's pip
uses as TMPDIR or cache must be root's alone, and so must every directory above it on the data
disk: a group-writable parent lets the group rename the child away and plant its own.

The files are rendered by real ansible-playbook from the roles' own templates and variables; the
directory owners and modes are the ones rig_host's task creates (its `_rig_host_dirs` list).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

DATA_DIR = "/opt1"
USER = GROUP = "vllm"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("rig_root_dirs")
    vars_files = [
        str(ROOT / "roles" / role / kind / "main.yml")
        for role in ("rig_host", "vllm")
        for kind in ("defaults", "vars")
    ]
    templates = ROOT / "roles" / "rig_host" / "templates"
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": vars_files,
            "tasks": [
                {
                    "name": f"Render {name}",
                    "ansible.builtin.template": {
                        "src": str(templates / f"{name}.j2"),
                        "dest": str(out / name),
                        "mode": "0644",
                    },
                }
                for name in ("pip.conf", "profile.sh")
            ]
            + [
                {
                    "name": "Write the directory specs and root's pip environment",
                    "ansible.builtin.copy": {
                        "content": "{{ {'dirs': _rig_host_dirs, 'pip_env': _vllm_pip_env} | to_json }}",
                        "dest": str(out / "specs.json"),
                        "mode": "0644",
                    },
                }
            ],
        }
    ]
    (out / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    evars = {
        "rig_data_dir": DATA_DIR,
        "rig_service_user": USER,
        "ansible_python_interpreter": str(VENV_BIN / "python"),
    }
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", json.dumps(evars),
         str(out / "play.yml")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    specs = json.loads((out / "specs.json").read_text())
    return {
        "pip_conf": (out / "pip.conf").read_text(),
        "profile": (out / "profile.sh").read_text(),
        "dirs": {d["path"]: d for d in specs["dirs"]},
        "pip_env": specs["pip_env"],
    }


def vllm_can_write(spec: dict[str, Any]) -> bool:
    mode = int(spec["mode"], 8)
    return spec["owner"] == USER or (spec["group"] == GROUP and bool(mode & 0o020)) or bool(mode & 0o002)


def assert_root_only(path: str, dirs: dict[str, dict[str, Any]]) -> None:
    """The directory and each one above it, up to the data disk, is rig_host's and root's alone."""
    here = PurePosixPath(path)
    assert here.is_relative_to(DATA_DIR) and here != PurePosixPath(DATA_DIR), path
    while here != PurePosixPath(DATA_DIR):
        spec = dirs.get(str(here))
        assert spec is not None, f"{here} (above or at {path}) is not a directory rig_host makes"
        assert not vllm_can_write(spec), f"{here} is writable by {USER}: {spec} (root's pip uses {path})"
        here = here.parent
    # The data disk itself: root root 0755 (rig_host's data_disk.yml).
    data_disk = yaml.safe_load((ROOT / "roles/rig_host/tasks/data_disk.yml").read_text())
    plain = next(t for t in data_disk if "ansible.builtin.file" in t)["ansible.builtin.file"]
    assert not vllm_can_write({"owner": plain["owner"], "group": plain["group"], "mode": plain["mode"]})


def root_pip_dirs(rendered: dict[str, Any]) -> dict[str, str]:
    """Every directory root's pip is pointed at, and where the pointer is."""
    found = {"vllm role TMPDIR": rendered["pip_env"]["TMPDIR"],
             "vllm role PIP_CACHE_DIR": rendered["pip_env"]["PIP_CACHE_DIR"]}  # fmt: skip
    found["/etc/pip.conf cache-dir"] = re.search(r"^cache-dir = (\S+)$", rendered["pip_conf"], re.M)[1]
    # What a root shell exports: the root branch of the profile, or all of it when it has none.
    root_part = rendered["profile"].split('if [ "$(id -u)" -eq 0 ]; then', 1)[-1].split("else", 1)[0]
    for name in ("TMPDIR", "PIP_CACHE_DIR"):
        found[f"profile (root) {name}"] = re.search(rf"export {name}=(\S+)", root_part)[1]
    return found


def test_no_directory_roots_pip_uses_is_writable_by_vllm(rendered: dict[str, Any]) -> None:
    """Hostile: vLLM (the vllm user, the vllm group) writes a wheel where root's pip would read it.

    Before the fix every one of these was /opt1/tmp or /opt1/cache/pip, root:vllm 0770.
    """
    found = root_pip_dirs(rendered)
    assert len(found) == 5, found
    for where, path in found.items():
        assert_root_only(path, rendered["dirs"]), where


def test_vllm_keeps_its_own_writable_dirs(rendered: dict[str, Any]) -> None:
    """The unit's TMPDIR and caches stay the vllm user's (and root's are not among them)."""
    unit = (ROOT / "roles/vllm_service/templates/vllm.service.j2").read_text()
    for env in ("TMPDIR", "HF_HOME", "VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):
        rel = re.search(rf"^Environment={env}={{{{ vllm_service_data_dir }}}}(\S+)$", unit, re.M)[1]
        spec = rendered["dirs"][DATA_DIR + rel]
        assert vllm_can_write(spec), (env, spec)
    assert set(root_pip_dirs(rendered).values()).isdisjoint(
        p for p, spec in rendered["dirs"].items() if vllm_can_write(spec)
    )
