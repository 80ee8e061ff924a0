"""roles/nvidia_driver trusts NVIDIA's repository key only by its pinned fingerprint.

The real repo_key.yml tasks run (real ansible-playbook, real gpg) against keys generated here and
served over HTTP from this machine: the pinned one is written as apt's keyring; another key, or the
pinned one with another beside it, is refused in one line and nothing is written. Before the fix
the role installed whatever cuda-keyring .deb the URL served.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN

pytestmark = pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg is not installed")


def gpg(home: Path, *args: str) -> str:
    return subprocess.run(
        ["gpg", "--batch", "--pinentry-mode", "loopback", "--homedir", str(home), *args],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip


def primary_fprs(home: Path, path: Path) -> list[str]:
    out = gpg(home, "--show-keys", "--with-colons", str(path))
    return re.findall(r"^pub:[^\n]*\nfpr:{9}([0-9A-F]+):", out, re.M)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two throwaway keys (NVIDIA's stand-in and an impostor), armored, in a served directory."""
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    served = tmp_path_factory.mktemp("served")
    fprs = {}
    for name in ("nvidia", "impostor"):
        uid = f"{name} <{name}@example.invalid>"
        gpg(home, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        (served / f"{name}.pub").write_text(gpg(home, "--armor", "--export", uid))
        fprs[name] = primary_fprs(home, served / f"{name}.pub")[0]
    # The pinned key with another appended: apt would trust both.
    (served / "both.pub").write_text(
        (served / "nvidia.pub").read_text() + (served / "impostor.pub").read_text()
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield {"home": home, "fprs": fprs, "url": f"http://127.0.0.1:{server.server_address[1]}"}
    server.shutdown()
    # Key generation started this home's own gpg-agent: stop it (only it).
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, timeout=30)


def converge(tmp_path: Path, keys: dict[str, Any], served: str, pinned: str) -> tuple[int, str, Path]:
    keyring = tmp_path / "keyrings" / "cuda.gpg"
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Install the repository key",
                   "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "repo_key"}}],
    }]))  # fmt: skip
    evars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(VENV_BIN / "python"),
        "nvidia_driver_repo_key_url": f"{keys['url']}/{served}",
        "nvidia_driver_repo_key_fingerprint": pinned,
        "_nvidia_driver_keyring": str(keyring),
    }
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-e", json.dumps(evars), str(book)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, keyring


def test_the_pinned_key_is_installed_once(tmp_path: Path, keys: dict[str, Any]) -> None:
    # Written with spaces, as NVIDIA publishes fingerprints.
    pinned = " ".join(re.findall("....", keys["fprs"]["nvidia"]))
    rc, out, keyring = converge(tmp_path, keys, "nvidia.pub", pinned)
    assert rc == 0, out[-3000:]
    assert primary_fprs(keys["home"], keyring) == [keys["fprs"]["nvidia"]]
    assert keyring.read_bytes()[:1] != b"-", "apt's signed-by keyring is the dearmored key"
    # Converged: the keyring in place is checked, nothing is fetched (the URL now serves nothing).
    rc, out, _ = converge(tmp_path, keys, "missing.pub", pinned)
    assert rc == 0, out[-3000:]
    assert re.search(r"changed=0\b", out), out[-3000:]


@pytest.mark.parametrize("served", ["impostor.pub", "both.pub"])
def test_another_key_is_refused_in_one_line(tmp_path: Path, keys: dict[str, Any], served: str) -> None:
    """Hostile: the URL (a mirror, a proxy) serves a key that is not the pinned one."""
    rc, out, keyring = converge(tmp_path, keys, served, keys["fprs"]["nvidia"])
    assert rc != 0
    # The error line says it whole: what was refused, its fingerprint and the pinned one.
    refusal = [
        line for line in out.splitlines() if "[ERROR]" in line and "refusing the CUDA repository key" in line
    ]
    assert len(refusal) == 1, out[-3000:]
    assert keys["fprs"]["impostor"] in refusal[0] and keys["fprs"]["nvidia"] in refusal[0]
    assert not keyring.exists()
