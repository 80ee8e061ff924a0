"""Run the project's playbooks with ansible-runner and read what they did from its events."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

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


def bin_dirs() -> list[Path]:
    """Where this virtualenv's Ansible commands are: next to the interpreter, then pip's scripts
    directory. Not PATH: an MCP client starts the server with an environment of its own choosing,
    often without PATH, and a PATH entry must not pick which ansible-playbook runs."""
    dirs: list[Path] = []
    for candidate in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if candidate not in dirs:
            dirs.append(candidate)
    return dirs


def ansible_command(name: str) -> str:
    """The absolute path of this virtualenv's ``name`` (ansible-playbook, ansible-inventory)."""
    for directory in bin_dirs():
        path = directory / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    where = " or ".join(str(d) for d in bin_dirs())
    raise PlaybookFailed(f"{name} not found in {where}: run scripts/setup.sh")


def environment() -> dict[str, str]:
    """The environment ansible-playbook needs (the same the tests and README set)."""
    venv_bin = str(Path(ansible_command("ansible-playbook")).parent)
    return {
        "ANSIBLE_CONFIG": os.environ.get("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg")),
        "CONTAINERS_CONF": os.environ.get(
            "CONTAINERS_CONF", str(ROOT / "roles/local_rig/files/containers.conf")
        ),
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_NOCOLOR": "1",
    }


class _UnsafeDumper(yaml.SafeDumper):
    """Dumps every string (value or key) tagged !unsafe: Ansible never templates those."""


def _unsafe_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Double-quoted: YAML escapes every character a plain scalar could not carry (NUL, newlines,
    # non-printables), so the string loads back byte for byte.
    return dumper.represent_scalar("!unsafe", value, style='"')


class _Name(str):
    """A top-level variable name, checked to be one: dumped plain. Ansible takes a name tagged
    !unsafe as some other name than the play's variable, which then keeps its own value."""


def _plain_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value))


_UnsafeDumper.add_representer(str, _unsafe_str)
_UnsafeDumper.add_representer(_Name, _plain_str)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def unsafe_yaml(extravars: dict[str, Any]) -> str:
    """``extravars`` as a YAML document in which every string is !unsafe (untrusted data)."""
    for key in extravars:
        if not isinstance(key, str) or not _NAME.match(key):
            raise PlaybookFailed(f"extra variable name {key!r} is not a variable name")
    named = {_Name(key): value for key, value in extravars.items()}
    text = yaml.dump(named, Dumper=_UnsafeDumper, allow_unicode=True, width=1 << 30)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # JSON can carry a lone surrogate (\ud800); no playbook or model can take one.
        raise PlaybookFailed("an argument holds a lone surrogate (not valid Unicode): refused") from None
    return text


class PlaybookRunner:
    """Runs playbooks from ``root`` against ``inventories`` through ansible-runner."""

    def __init__(self, inventories: list[str], root: Path = ROOT) -> None:
        self.root = root
        self.inventories = [str((root / inv).resolve()) for inv in inventories]

    def inventory(self) -> dict[str, Any]:
        """`ansible-inventory --list` of the inventories (hosts, groups, host variables)."""
        # Straight from ansible-inventory's stdout: ansible-runner's get_inventory would leave an
        # artifact directory holding the whole list, decrypted vault values (rig_api_key) included.
        argv = [ansible_command("ansible-inventory"), "--list"]
        for inv in self.inventories:
            argv += ["-i", inv]
        # An inventory that does not parse is an error, not a warning and an empty list of rigs.
        env = {**os.environ, **environment(), "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True"}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.root, check=False)
        except OSError as exc:
            raise PlaybookFailed(f"ansible-inventory could not run: {exc}") from None
        tail = " ".join(done.stderr.strip().splitlines()[-3:])[-500:]
        if done.returncode != 0:
            raise PlaybookFailed(f"ansible-inventory failed (rc {done.returncode}): {tail or 'no message'}")
        try:
            out = json.loads(done.stdout)
        except ValueError:
            out = None
        if not isinstance(out, dict):
            raise PlaybookFailed(f"ansible-inventory printed no inventory: {tail or 'no message'}")
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

        # A private directory per run, removed after: the extra vars (a prompt) and
        # ansible-runner's artifacts go there, and nothing of a run is kept on the controller.
        private = tempfile.mkdtemp(prefix="rig-mcp-")
        try:
            cmdline = None
            if extravars:
                # Never ansible-runner's extravars=: those reach ansible-playbook as -e, and
                # Ansible trusts command-line values as templates ({{ lookup('pipe', ...) }} in
                # a prompt would run on the controller). A file of !unsafe values is data only.
                path = Path(private) / "untrusted-vars.yml"
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(unsafe_yaml(extravars))
                # ansible-runner shlex-splits cmdline: the path is quoted for that.
                cmdline = shlex.join(["-e", f"@{path}"])
            result = ansible_runner.run(
                private_data_dir=private,
                project_dir=str(self.root),
                playbook=str(self.root / playbook),
                inventory=self.inventories,
                limit=limit,
                cmdline=cmdline,
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
