"""Run the project's playbooks with ansible-runner and read what they did from its events."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

ROOT = Path(__file__).resolve().parent.parent


class PlaybookFailed(Exception):
    """A playbook failed: the failing task and its message, one line each."""


@dataclass
class Failure:
    """The first failed (not ignored) task of a run."""

    host: str
    task: str
    message: str

    def describe(self, playbook: str) -> str:
        return f"{playbook} failed on {self.host} at task '{self.task}': {self.message}"


@dataclass
class PlayRun:
    """What one playbook run did: its status, rc, task results per host, and the first failure."""

    playbook: str
    status: str
    rc: int
    results: list[dict[str, Any]] = field(default_factory=list)
    failure: Failure | None = None

    def result(self, task: str, host: str | None = None) -> dict[str, Any] | None:
        """The last result of the task named ``task`` (on ``host``, when given)."""
        found = [r for r in self.results if r["task"] == task and (host is None or r["host"] == host)]
        return found[-1]["res"] if found else None


def failure_message(res: dict[str, Any]) -> str:
    """The words a failed task result carries: msg, then the command's stderr/stdout tail."""
    if res.get("censored"):
        return str(res["censored"])
    parts: list[str] = []
    msg = res.get("msg")
    if msg:
        parts.append(msg if isinstance(msg, str) else str(msg))
    for key in ("stderr", "stdout"):
        text = (res.get(key) or "").strip()
        if text and text not in parts:
            parts.append("\n".join(text.splitlines()[-15:]))
            break
    if not parts and res.get("status") is not None:
        parts.append(f"HTTP status {res['status']}")
    return "\n".join(parts) or "no message"


def environment() -> dict[str, str]:
    """The environment ansible-playbook needs (the same the tests and README set)."""
    venv_bin = str(Path(sys.executable).parent)
    return {
        "ANSIBLE_CONFIG": os.environ.get("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg")),
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "files" / "containers.conf")),
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_NOCOLOR": "1",
    }


class PlaybookRunner:
    """Runs playbooks from ``root`` against ``inventories`` through ansible-runner."""

    def __init__(self, inventories: list[str], root: Path = ROOT) -> None:
        self.root = root
        self.inventories = [str((root / inv).resolve()) for inv in inventories]

    def inventory(self) -> dict[str, Any]:
        """`ansible-inventory --list` of the inventories (hosts, groups, host variables)."""
        out, err = ansible_runner.get_inventory(
            action="list",
            inventories=self.inventories,
            response_format="json",
            quiet=True,
            envvars=environment(),
        )
        if not isinstance(out, dict):
            raise PlaybookFailed(f"ansible-inventory failed: {(err or out or '').strip()[-500:]}")
        return out

    def run(
        self,
        playbook: str,
        limit: str | None = None,
        extravars: dict[str, Any] | None = None,
        on_step: Callable[[str], None] | None = None,
    ) -> PlayRun:
        """Run one playbook; ``on_step`` hears each play and task as it starts. Never raises on
        a failed play: the caller reads ``failure``."""
        run = PlayRun(playbook=playbook, status="", rc=-1)

        def handler(event: dict[str, Any]) -> bool:
            kind = event.get("event", "")
            data = event.get("event_data", {})
            if on_step is not None and kind == "playbook_on_play_start":
                on_step(f"play: {data.get('play', '')}")
            elif on_step is not None and kind == "playbook_on_task_start":
                on_step(f"task: {data.get('task', '')}")
            elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
                res = data.get("res", {}) or {}
                failed = kind in ("runner_on_failed", "runner_on_unreachable") and not data.get(
                    "ignore_errors"
                )
                run.results.append(
                    {"task": data.get("task", ""), "host": data.get("host", ""), "res": res, "failed": failed}
                )
                if failed and run.failure is None:
                    run.failure = Failure(data.get("host", ""), data.get("task", ""), failure_message(res))
            # False: ansible-runner keeps no copy of the event on disk.
            return False

        # A private directory per run, removed after: ansible-runner writes the extra vars (a
        # prompt) and its artifacts there, and nothing of a run is kept on the controller.
        private = tempfile.mkdtemp(prefix="rig-mcp-")
        try:
            result = ansible_runner.run(
                private_data_dir=private,
                project_dir=str(self.root),
                playbook=str(self.root / playbook),
                inventory=self.inventories,
                limit=limit,
                extravars=extravars or {},
                envvars=environment(),
                event_handler=handler,
                quiet=True,
                settings={"suppress_ansible_output": True},
            )
            run.status, run.rc = result.status, int(result.rc if result.rc is not None else -1)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        if run.failure is None and run.status != "successful":
            run.failure = Failure("-", "-", f"ansible-playbook ended {run.status} (rc {run.rc})")
        return run
