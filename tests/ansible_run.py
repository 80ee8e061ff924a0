"""Run ansible-playbook from tests and read its recap."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, VENV_BIN

_RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$", re.MULTILINE)
# ansible.posix.profile_tasks' closing list (ansible.cfg enables it): "Task name ---- 12.34s".
_TASK_TIME = re.compile(r"^(?P<task>\S.*?) -{3,} (?P<seconds>\d+\.\d+)s$", re.MULTILINE)


@dataclass
class PlaybookRun:
    """The outcome of one ansible-playbook run."""

    rc: int
    output: str
    seconds: float
    recap: dict[str, dict[str, int]]

    def total(self, key: str, hosts: Iterable[str] = ()) -> int:
        """Sum one recap counter (ok, changed, failed, ...) over the hosts named, or every host
        when ``hosts`` is empty.

        A run without a PLAY RECAP (a syntax error, a crash) has no counters at all: reading one
        from it raises instead of answering 0, and so does a run whose recap lacks a host named
        in ``hosts`` (a play that never reached it changed nothing only in appearance).
        """
        if not self.recap:
            raise RecapMissing(
                f"ansible-playbook printed no PLAY RECAP (rc {self.rc}):\n{self.output[-3000:]}"
            )
        named = set(hosts)
        missing = sorted(named - set(self.recap))
        if missing:
            raise RecapMissing(f"the PLAY RECAP has no line for {', '.join(missing)}: {sorted(self.recap)}")
        return sum(counts.get(key, 0) for host, counts in self.recap.items() if not named or host in named)

    def slowest(self, n: int = 3) -> str:
        """The n slowest tasks from profile_tasks' closing list, for a figure: where the time went."""
        summary = self.output[self.output.rfind("=" * 20) :] if "=" * 20 in self.output else ""
        tasks = [(float(m["seconds"]), m["task"]) for m in _TASK_TIME.finditer(summary)]
        return "; ".join(f"{task} {seconds:.0f} s" for seconds, task in sorted(tasks, reverse=True)[:n])


class RecapMissing(AssertionError):
    """A run's recap cannot answer the question asked of it."""


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """Parse the PLAY RECAP block into {host: {counter: value}}."""
    recap_start = output.rfind("PLAY RECAP")
    recap: dict[str, dict[str, int]] = {}
    if recap_start < 0:
        return recap
    for match in _RECAP.finditer(output[recap_start:]):
        counts = dict(item.split("=") for item in match.group("counts").split())
        recap[match.group("host")] = {k: int(v) for k, v in counts.items()}
    return recap


def run_playbook(
    playbook: str,
    *args: str,
    inventory: Path | str | None = None,
    extra_vars: dict | None = None,
    timeout: float = 3600,
) -> PlaybookRun:
    """Run a playbook from the repository root; never raises on a failed play."""
    cmd = [str(VENV_BIN / "ansible-playbook"), playbook, *args]
    if inventory is not None:
        cmd += ["-i", str(inventory)]
    if extra_vars:
        cmd += ["-e", json.dumps(extra_vars)]
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = proc.stdout + proc.stderr
    return PlaybookRun(proc.returncode, output, time.monotonic() - started, parse_recap(proc.stdout))


def module_docs(*modules: str) -> dict[str, dict]:
    """``ansible-doc --json`` of the project's own modules (library/), as ansible.cfg resolves their
    doc fragments; fails the test with ansible-doc's stderr when a module's docs do not render."""
    result = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "-M", "library", "--json", *modules],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def render_gateway(
    tmp: Path, inventory: Path | str, secrets: dict, *args: str, timeout: float = 300
) -> PlaybookRun:
    """The gateway role's tls and config tasks on the inventory's gateways (what gateway.yml runs
    there, without provisioning); ``secrets`` go in a 0600 file under ``tmp``, never on a command
    line."""
    secrets_file = tmp / "secrets.json"
    secrets_file.touch(mode=0o600)
    secrets_file.write_text(json.dumps(secrets))
    role = "ansible.builtin.include_role"
    tasks = [
        {"name": "TLS", role: {"name": "gateway", "tasks_from": "tls"}},
        {"name": "Config", role: {"name": "gateway", "tasks_from": "config"}},
    ]
    play = tmp / "play.yml"
    play.write_text(json.dumps([{"hosts": "gateways", "gather_facts": False, "tasks": tasks}]))
    return run_playbook(str(play), "-e", f"@{secrets_file}", *args, inventory=inventory, timeout=timeout)
