"""Running the cloud playbooks against a local fake API, shared by the gce and tpu playbook tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from tests.conftest import ROOT, VENV_BIN


def play(
    cloud: str, playbook: str, inventory: Path, endpoint: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook against the fake at ``endpoint``: ``cloud`` (gce, tpu) prefixes the role's
    endpoint, auth and SSH-wait variables; nothing answers SSH here, so the wait is 1 s."""
    cmd = [
        str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), playbook,
        "-e", f"{cloud}_api_endpoint={endpoint}", "-e", f"{cloud}_auth_kind=anonymous",
        "-e", f"{cloud}_ssh_wait_timeout=1",
        # The pinned host keys go next to the test's inventory, never into the user's files.
        "-e", f"{cloud}_known_hosts_file={inventory.parent / 'known_hosts'}", *extra,
    ]  # fmt: skip
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)


def find_then_say(tmp_path: Path, msg: str) -> Path:
    """A playbook as the ops playbooks start: find the VMs, then act on the rigs (here: debug ``msg``)."""
    path = tmp_path / "where.yml"
    path.write_text(
        yaml.safe_dump([
            {"name": "Find", "ansible.builtin.import_playbook": str(ROOT / "playbooks" / "find_vms.yml")},
            {"name": "Act", "hosts": "rigs", "gather_facts": False,
             "tasks": [{"name": "Say where", "ansible.builtin.debug": {"msg": msg}}]},
        ])
    )  # fmt: skip
    return path


def assert_pinned(
    known_hosts: Path, alias: str, keys: dict[str, str], later: subprocess.CompletedProcess
) -> None:
    """``known_hosts`` holds exactly ``keys`` (type -> base64) under ``alias``, and ``later`` (a
    find_then_say run printing ``ARGS {{ ansible_ssh_common_args }}``) reached the host with ssh args
    that accept those keys only."""
    assert sorted(known_hosts.read_text().splitlines()) == sorted(f"{alias} {k} {v}" for k, v in keys.items())
    out = " ".join((later.stdout + later.stderr).split())
    assert later.returncode == 0, out[-3000:]
    assert f"-o UserKnownHostsFile={known_hosts}" in out and "-o StrictHostKeyChecking=yes" in out, out[
        -3000:
    ]
    assert f"-o HostKeyAlias={alias}" in out, out[-3000:]
