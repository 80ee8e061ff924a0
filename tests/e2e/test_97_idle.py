"""Idle auto-stop on the local rig (docs/idle.md): with rig_idle_stop_minutes 1 the role installs the
idle timer; a request in flight keeps the rig up even when the count says it has been idle long
enough; once nothing comes, the rig powers itself off and its container stops, no sooner than the
idle time. It runs right before test_99_teardown, which removes the stopped rig as it removes a
running one: nothing after it needs the rig up.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.e2e.rig import podman

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "none"  # serving, closed or opened (test_95 leaves it opened): this file reads the key

STATE = "/var/lib/gemma-rig/idle.json"  # rig_swap_state_dir/idle.json
MINUTES = 1
CHECK_SECONDS = 30  # vllm_service_idle_check_seconds


def rig_exec(container: str, *cmd: str) -> str:
    result = podman("exec", container, *cmd)
    assert result.returncode == 0, f"{cmd}: {result.stderr or result.stdout}"
    return result.stdout


def idle(container: str, *args: str) -> dict:
    return json.loads(rig_exec(container, "rigctl", "idle", *args, "--json"))


def running(container: str) -> bool:
    return podman("inspect", "-f", "{{.State.Running}}", container).stdout.strip() == "true"


class Client:
    """Two threads sending long chats back to back (ignore_eos: each runs to max_tokens), so one
    is nearly always in flight, until stopped."""

    def __init__(self, port: int, model: str, key: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "Count."}], "max_tokens": 400,
                "ignore_eos": True}  # fmt: skip
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.request = (f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), headers)
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(2)]

    def loop(self) -> None:
        url, data, headers = self.request
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=300) as r:
                    r.read()
            except OSError as exc:
                self.errors.append(str(exc))
                return

    def __enter__(self) -> Client:
        for t in self.threads:
            t.start()
            time.sleep(1)  # staggered: one starts while the other runs
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=300)


def test_an_idle_rig_stops_itself_and_a_request_in_flight_keeps_it_up(local_rig, tmp_path: Path) -> None:
    c = local_rig.container
    play = tmp_path / "idle.yml"
    task = {
        "name": "Idle timer",
        "ansible.builtin.include_role": {"name": "vllm_service", "tasks_from": "idle"},
    }
    play.write_text(yaml.safe_dump([{"hosts": "rig-local", "gather_facts": False, "tasks": [task]}]))
    run = run_playbook(str(play), "-i", "inventory/local.yml", extra_vars={"rig_idle_stop_minutes": MINUTES})
    assert run.rc == 0 and run.total("changed") > 0, run.output[-4000:]
    assert rig_exec(c, "systemctl", "is-active", "vllm-idle.timer").strip() == "active"
    # The timer paused while the count is made older by hand: only this test's calls decide.
    rig_exec(c, "systemctl", "stop", "vllm-idle.timer")
    env = dict(
        line.split("=", 1)
        for line in rig_exec(c, "cat", "/etc/gemma-rig/tpu.env").splitlines()
        if "=" in line
    )
    model = json.loads(podman("exec", c, "rigctl", "status", "--json").stdout)["build"]
    with Client(local_rig.port, model, env.get("VLLM_API_KEY", "").strip('"')) as client:
        decisions = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            "requests running" in " ".join(d["blocked_by"]) for d in decisions
        ):
            idle(c)  # the count as of now, then aged: idle ten minutes by the count
            rig_exec(c, "python3", "-c", "import json,sys; p=sys.argv[1]; s=json.load(open(p)); "
                     "s['idle_since'] -= 600; json.dump(s, open(p, 'w'))", STATE)  # fmt: skip
            decisions.append(idle(c, "--stop-after", str(MINUTES)))
        assert not client.errors, client.errors
    assert any("requests running: " in " ".join(d["blocked_by"]) for d in decisions), decisions
    assert not any(d["stopping"] for d in decisions) and running(c), decisions
    # Quiet from here: one check records the counters as they stay, then the timer checks again and
    # the rig stops itself once idle MINUTES.
    quiet = time.monotonic()
    assert idle(c)["blocked_by"] == []
    rig_exec(c, "systemctl", "start", "vllm-idle.timer")
    journal = ""
    deadline = quiet + MINUTES * 60 + 3 * CHECK_SECONDS
    while running(c) and time.monotonic() < deadline:
        seen = podman("exec", c, "journalctl", "-t", "gemma-rig-idle", "-o", "cat", "--no-pager")
        journal = seen.stdout or journal
        time.sleep(3)
    stopped = time.monotonic()
    assert not running(c), f"still running {MINUTES} min after the last request; journal:\n{journal}"
    assert stopped - quiet >= MINUTES * 60, f"stopped before it was idle {MINUTES} min:\n{journal}"
    assert "idle " in journal, journal  # the timer's decisions, under its tag
