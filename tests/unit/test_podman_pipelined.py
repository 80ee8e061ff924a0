"""connection_plugins/podman_pipelined: a module runs in one `podman exec -i`, its code on stdin.

podman is replaced by a fake that follows its command line (`podman mount NAME`, `podman exec
[-i] [--user U] NAME CMD...`, `podman cp SRC NAME:DST`) and runs the commands on this machine,
logging every call; the real plugin and ansible do everything else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

FAKE_PODMAN = """#!/bin/sh
# podman, as far as the connection plugin uses it: every call is logged, commands run here.
printf '%s\\n' "$*" >> "$FAKE_PODMAN_LOG"
case "$1" in
  mount) exit 125 ;;  # rootless-like: no mount point, files go through `podman cp`
  cp) src=$2; dst=${3#*:}; exec cp "$src" "$dst" ;;
  exec)
    shift
    interactive=0
    while :; do
      case "$1" in
        -i|--interactive) interactive=1; shift ;;
        --user) shift 2 ;;
        *) break ;;
      esac
    done
    shift  # the container
    if [ "$interactive" = 1 ]; then exec "$@"; else exec "$@" < /dev/null; fi ;;
esac
echo "fake podman: unsupported: $*" >&2
exit 125
"""


@pytest.fixture
def fake_podman(tmp_path: Path) -> tuple[Path, Path]:
    exe = tmp_path / "podman"
    exe.write_text(FAKE_PODMAN)
    exe.chmod(0o755)
    return exe, tmp_path / "podman.log"


def adhoc(
    fake: tuple[Path, Path], module: str, args: str, connection: str
) -> subprocess.CompletedProcess[str]:
    exe, log = fake
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "FAKE_PODMAN_LOG": str(log),
    }
    return subprocess.run(
        [
            str(VENV_BIN / "ansible"),
            "all",
            "-i",
            "rig,",
            "-c",
            connection,
            "-e",
            json.dumps({"ansible_podman_executable": str(exe), "ansible_python_interpreter": sys.executable}),
            "-m",
            module,
            "-a",
            args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_a_module_is_one_exec_with_its_code_on_stdin(fake_podman, tmp_path: Path) -> None:
    target = tmp_path / "made"
    run = adhoc(fake_podman, "ansible.builtin.file", f"path={target} state=directory", "podman_pipelined")
    assert run.returncode == 0, run.stdout + run.stderr
    assert target.is_dir()  # the module really ran
    calls = [c for c in fake_podman[1].read_text().splitlines() if not c.startswith("mount")]
    assert len(calls) == 1, calls
    assert calls[0].startswith("exec -i rig ")
    assert not any(c.startswith("cp ") for c in calls)


def test_the_collections_plugin_needs_four_calls(fake_podman, tmp_path: Path) -> None:
    """The comparison the plugin exists for: the same task without pipelining."""
    target = tmp_path / "made"
    run = adhoc(
        fake_podman, "ansible.builtin.file", f"path={target} state=directory", "containers.podman.podman"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    calls = [c for c in fake_podman[1].read_text().splitlines() if not c.startswith("mount")]
    assert len(calls) >= 3 and any(c.startswith("cp ") for c in calls), calls


def test_raw_commands_still_run_without_stdin(fake_podman) -> None:
    run = adhoc(fake_podman, "ansible.builtin.raw", "echo raw-ran", "podman_pipelined")
    assert run.returncode == 0 and "raw-ran" in run.stdout, run.stdout + run.stderr
    calls = fake_podman[1].read_text().splitlines()
    assert any(c.startswith("exec rig ") for c in calls), calls  # no -i: nothing to send


def test_synchronize_runs_rsync_over_podman_exec(fake_podman, tmp_path: Path) -> None:
    """The checkpoint push uses synchronize, which works only over connections it knows as podman."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "shard.bin").write_bytes(b"weights")
    run = adhoc(fake_podman, "ansible.posix.synchronize", f"src={src}/ dest={dest}/", "podman_pipelined")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (dest / "shard.bin").read_bytes() == b"weights"
    assert any(c.startswith("exec -i rig rsync --server") for c in fake_podman[1].read_text().splitlines())
