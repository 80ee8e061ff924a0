"""The rig's vLLM install from an index is hash-locked.

The lock files (roles/vllm/files/lock/, made by make_lock.py from pip's own resolver for the rig's
Python and platform) pin every distribution with == and a sha256. The role's real install tasks
run (real ansible-playbook, a real virtualenv, real pip) against a local find-links directory that
stands in for the index: pip installs what the lock names, and refuses a file whose bytes are not
the locked ones (a tampered mirror, an index that changed a file). Before the fix the role ran
`pip install vllm==0.29.0` and took whatever the index served, dependencies unpinned.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

LOCK_DIR = ROOT / "roles" / "vllm" / "files" / "lock"
LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+) --hash=sha256:[0-9a-f]{64}$")
# Each lock and what the platform's group_vars install from it (package==version plus extras).
LOCKS = {
    "vllm-0.29.0.txt": ("gce", ["vllm==0.29.0"], "CPython 3.13, glibc 2.41"),
    "vllm-tpu-0.29.0.txt": ("tpu", ["vllm-tpu==0.29.0", "tpu-inference==0.29.0"], "CPython 3.12, glibc 2.35"),
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_line_is_pinned_and_hashed(lock: str) -> None:
    platform, wanted, target = LOCKS[lock]
    lines = (LOCK_DIR / lock).read_text().splitlines()
    assert target in lines[0], f"{lock} was resolved for another platform: {lines[0]}"
    pins = [line for line in lines if line and not line.startswith("#")]
    assert len(pins) > 50, "vLLM's dependencies are missing"
    bad = [line for line in pins if not LINE.match(line)]
    assert not bad, bad
    names = [norm(LINE.match(line)[1]) for line in pins]
    assert len(names) == len(set(names)), "a distribution is locked twice"
    locked = {f"{norm(LINE.match(p)[1])}=={LINE.match(p)[2]}" for p in pins}
    assert {norm(w.split("==")[0]) + "==" + w.split("==")[1] for w in wanted} <= locked
    # What the platform's group_vars install is what this lock was made for.
    group = yaml.safe_load((ROOT / "inventory" / "group_vars" / f"{platform}.yml").read_text()) or {}
    package = group.get("vllm_package", "vllm")
    assert f"{norm(package)}==0.29.0" in locked
    for extra in group.get("vllm_extra_packages", []):
        assert norm(extra.split("==")[0]) + "==" + extra.split("==")[1] in locked


def test_the_index_install_requires_the_hashes() -> None:
    tasks = yaml.safe_load((ROOT / "roles" / "vllm" / "tasks" / "install.yml").read_text())
    block = next(t for t in tasks if t.get("name") == "Install vLLM from the package index, hash-locked")
    argv = next(t for t in block["block"] if "ansible.builtin.command" in t)["ansible.builtin.command"][
        "argv"
    ]
    assert "'--require-hashes'" in argv and "'-r', _vllm_lock_dest" in argv, argv
    assert "_vllm_requirements" not in argv, "nothing is installed beside the lock"


def wheel(path: Path, name: str, version: str, body: str) -> str:
    """A minimal pure wheel at ``path``; returns its sha256."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": body,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in files.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}")
            zf.writestr(rel, data)
        zf.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rig's virtualenv, made once by the role's own task in the first converge."""
    return tmp_path_factory.mktemp("rig") / "venv"


def converge(tmp_path: Path, venv: Path, index: Path, lock: Path) -> tuple[int, str]:
    (tmp_path / "root-tmp").mkdir(exist_ok=True)
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Install", "ansible.builtin.include_role": {"name": "vllm", "tasks_from": "install"}}],
    }]))  # fmt: skip
    evars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(VENV_BIN / "python"),
        "vllm_venv_dir": str(venv),
        "vllm_system_python": str(VENV_BIN / "python"),
        "vllm_lock_file": str(lock),
        "vllm_pip_tmp_dir": str(tmp_path / "root-tmp"),
        "vllm_pip_cache_dir": str(tmp_path / "root-tmp" / "pip-cache"),
        "_vllm_versions": {"vllm": None},
    }
    # The stand-in index: a find-links directory, no network, none of this machine's pip config.
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PIP_CONFIG_FILE": os.devnull,
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}  # fmt: skip
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", json.dumps(evars), str(play)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def installed(venv: Path) -> str:
    return (next(venv.glob("lib/python3*/site-packages")) / "vllm" / "__init__.py").read_text()


def test_pip_installs_the_locked_bytes_and_refuses_others(tmp_path: Path, venv: Path) -> None:
    index = tmp_path / "index"
    index.mkdir()
    good = wheel(index / "vllm-0.29.0-py3-none-any.whl", "vllm", "0.29.0", "GOOD = True\n")
    lock = tmp_path / "lock.txt"
    lock.write_text(f"# test lock\nvllm==0.29.0 --hash=sha256:{good}\n")
    rc, out = converge(tmp_path, venv, index, lock)
    assert rc == 0, out[-4000:]
    assert installed(venv) == "GOOD = True\n"

    # Hostile: the index now serves other bytes under the same name and version.
    wheel(index / "vllm-0.29.0-py3-none-any.whl", "vllm", "0.29.0", "import os  # planted\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", "vllm"], check=True)
    rc, out = converge(tmp_path, venv, index, lock)
    assert rc != 0
    assert "DO NOT MATCH THE HASHES" in out, out[-4000:]
    assert not list(next(venv.glob("lib/python3*/site-packages")).glob("vllm*")), "the planted wheel went in"


def test_a_lock_that_does_not_pin_the_package_is_refused(tmp_path: Path, venv: Path) -> None:
    index = tmp_path / "index"
    index.mkdir()
    other = wheel(index / "other-1.0-py3-none-any.whl", "other", "1.0", "")
    lock = tmp_path / "stale.txt"
    lock.write_text(f"other==1.0 --hash=sha256:{other}\nvllm==0.28.9 --hash=sha256:{other}\n")
    rc, out = converge(tmp_path, venv, index, lock)
    assert rc != 0
    assert re.search(r"\[ERROR\].*stale\.txt does not pin vllm==0\.29\.0: regenerate it", out), out[-4000:]
