"""Start a playbook in the background and kill the controller under it, as a dead laptop would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.conftest import ROOT, VENV_BIN


def start_playbook(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """ansible-playbook ARGS from the repository root, its output in ``log``."""
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(VENV_BIN / "ansible-playbook"), *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (ansible's workers call setsid: a process group is not enough)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def kill_controller(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ansible-playbook and everything it started on this machine, all at once."""
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):  # gone already
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
