"""rigctl's idle check (docs/idle.md), on this machine: the metric names against the installed vLLM's
own source, a /metrics page as prometheus_client writes it, the decision (what counts as idle, what
blocks it, when it stops), hostile /metrics pages that never crash it or stop the rig, and `rigctl
idle` / `status` JSON against docs/mcp.md. The real rig runs it in tests/e2e/test_97_idle.py."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tests.ansible_run import run_playbook
from tests.conftest import ROOT, VENV_BIN
from tests.unit.test_rigctl import FREE, documented

_spec = importlib.util.spec_from_file_location("rigctl_idle", ROOT / "roles/vllm_service/files/rigctl.py")
rigctl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rigctl)

VLLM_METRICS = ROOT / ".venv/lib/python3.11/site-packages/vllm/v1/metrics/loggers.py"
HOSTILE_LABEL = 'a} 5\\" \\n {b="c"'


def vllm_page(running: float = 0, waiting: float = 0, success: float = 0, tokens: float = 0) -> str:
    """A /metrics page as vLLM's prometheus_client writes it: its names, labels and _total counters."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    for name, value in (("vllm:num_requests_running", running), ("vllm:num_requests_waiting", waiting)):
        Gauge(name, "g", labels, registry=registry).labels(HOSTILE_LABEL, "0").set(value)
    done = Counter("vllm:request_success", "c", [*labels, "finished_reason"], registry=registry)
    done.labels(HOSTILE_LABEL, "0", "stop").inc(success)
    done.labels(HOSTILE_LABEL, "0", "length").inc(0)
    for name in ("vllm:prompt_tokens", "vllm:generation_tokens"):
        Counter(name, "c", labels, registry=registry).labels(HOSTILE_LABEL, "0").inc(tokens)
    return generate_latest(registry).decode()


def test_the_names_are_vllms_own() -> None:
    """Each name rigctl reads is one the installed vLLM registers (a counter gains _total on the page)."""
    source = VLLM_METRICS.read_text()
    registered = set(re.findall(r'name="(vllm:[a-z_]+)"', source))
    for name in (*rigctl.IDLE_GAUGES, *rigctl.IDLE_COUNTERS):
        assert name.removesuffix("_total") in registered, name


def test_a_real_page_sums_over_label_sets() -> None:
    sums = rigctl.read_metrics(vllm_page(running=2, waiting=1, success=3, tokens=40))
    assert sums == {"vllm:num_requests_running": 2, "vllm:num_requests_waiting": 1,
                    "vllm:request_success_total": 3, "vllm:prompt_tokens_total": 40,
                    "vllm:generation_tokens_total": 40}  # fmt: skip


@pytest.mark.parametrize(
    "page",
    [
        "",
        "\x00\xff garbage {{{ \n",
        "vllm:num_requests_running 1\n",  # the rest missing
        vllm_page().replace("vllm:num_requests_running{", "vllm:num_requests_running_x{"),
        vllm_page().replace("} 0.0\n", "} NaN\n", 1),
        vllm_page().replace("} 0.0\n", "} +Inf\n", 1),
        vllm_page().replace("} 0.0\n", "} -1\n", 1),
        vllm_page().replace("} 0.0\n", "} 1e999\n", 1),
        vllm_page().replace("} 0.0\n", "} $(touch MARKER)\n", 1),
    ],
)
def test_a_hostile_page_is_an_error_never_a_figure(page: str) -> None:
    with pytest.raises(rigctl.RigctlError) as err:
        rigctl.read_metrics(page)
    assert "\n" not in str(err.value)


def seen(
    blocks: tuple[str, ...] = (), counters: tuple[float, ...] = (3, 40, 40), invocation: str = "a"
) -> dict:
    return {"invocation": invocation, "blocks": list(blocks), "counters": list(counters)}


def test_idle_counts_from_the_first_quiet_check_and_stops_at_the_threshold() -> None:
    first = rigctl.idle_decide(None, seen(), 1000.0, 2)
    assert (first["idle_since"], first["minutes_idle"], first["stop"]) == (1000.0, 0, False)
    later = rigctl.idle_decide(first, seen(), 1000.0 + 90, 2)
    assert (later["idle_since"], later["minutes_idle"], later["stop"]) == (1000.0, 1.5, False)
    done = rigctl.idle_decide(later, seen(), 1000.0 + 120, 2)
    assert done["stop"] is True and done["line"] == "stopping the rig: idle 2 min of 2"
    # No threshold (a manual `rigctl idle`): reported, never stopped.
    assert rigctl.idle_decide(later, seen(), 1000.0 + 9999, None)["stop"] is False


@pytest.mark.parametrize(
    "now_seen",
    [
        seen(counters=(4, 40, 40)),  # a request finished since
        seen(counters=(3, 41, 40)),
        seen(invocation="b"),  # vLLM restarted: its counters began again
        seen(blocks=("requests running: 1",)),
        seen(blocks=("a swap is in progress (switching)",)),
        seen(blocks=("a bench is running",)),
        seen(blocks=("vllm is activating",)),
        seen(blocks=("/metrics unreadable: refused",)),
    ],
)
def test_anything_moving_or_busy_starts_the_count_again(now_seen: dict) -> None:
    before = rigctl.idle_decide(None, seen(), 0.0, 1)
    after = rigctl.idle_decide(before, now_seen, 3600.0, 1)
    assert (after["idle_since"], after["minutes_idle"], after["stop"]) == (3600.0, 0, False)
    assert after["blocked_by"] == now_seen["blocks"]


@pytest.mark.parametrize("stored", [{"idle_since": "x", "invocation": "a", "counters": [3, 40, 40]},
                                    {"idle_since": 9e99, "invocation": "a", "counters": [3, 40, 40]},
                                    ["not", "an", "object"]])  # fmt: skip
def test_a_bad_state_file_starts_the_count_again(stored) -> None:
    assert rigctl.idle_decide(stored, seen(), 60.0, 1)["idle_since"] == 60.0


def test_bench_is_seen_in_its_working_folder_only(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "12").mkdir(parents=True)
    (proc / "12" / "cmdline").write_bytes(b"python3\0/var/tmp/other/bench.py\0")
    (proc / "self").mkdir()  # no cmdline: skipped
    assert rigctl.bench_running(str(proc)) is False
    (proc / "13").mkdir()
    (proc / "13" / "cmdline").write_bytes(b"/usr/bin/python3\0/var/tmp/gemma-rig-bench.x1/bench.py\0--url\0")
    assert rigctl.bench_running(str(proc)) is True


class Metrics:
    """A stand-in vLLM that serves one /metrics page (and checks the key)."""

    def __init__(self, page: str) -> None:
        self.page = page
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                ok = self.path == "/metrics" and self.headers.get("Authorization") == "Bearer k"
                body = outer.page.encode("utf-8", "surrogateescape") if ok else b""
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Calls(list):
    """The commands rigctl ran, and the stand-in rig's parts."""

    metrics: Metrics
    props: dict[str, str]
    dir: Path


@pytest.fixture
def idle_rig(tmp_path: Path, monkeypatch):
    """rigctl's settings, tpu.env with a key, a unit and a stand-in /metrics; returns the calls made."""
    monkeypatch.setattr(rigctl, "SETTINGS", {"unit": "svc", "env_file": str(tmp_path / "tpu.env"),
                                             "helper_dir": str(tmp_path), "python": "/p",
                                             "swap_state_dir": str(tmp_path)})  # fmt: skip
    monkeypatch.setattr(rigctl, "bench_running", lambda proc="/proc": False)
    metrics = Metrics(vllm_page(success=3, tokens=40))
    (tmp_path / "tpu.env").write_text(f"RIG_PORT={metrics.port}\nVLLM_API_KEY=k\n")
    calls = Calls()
    props = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "InvocationID": "i1"}

    def run(cmd, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        out = "".join(f"{k}={v}\n" for k, v in props.items()) if cmd[:2] == ["systemctl", "show"] else ""
        out = FREE if cmd[0] == "free" else out
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(rigctl, "run", run)
    calls.metrics, calls.props, calls.dir = metrics, props, tmp_path
    yield calls
    metrics.close()


def idle_json(capsys, *argv: str) -> tuple[int, dict]:
    code = rigctl.main(["idle", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def age_state(folder: Path, minutes: float) -> None:
    """Make the stored idle count older, as if the timer had seen the same counters that long."""
    state = json.loads((folder / "idle.json").read_text())
    state["idle_since"] -= minutes * 60
    (folder / "idle.json").write_text(json.dumps(state))


def test_the_timer_stops_an_idle_rig_and_says_why_in_the_journal(idle_rig, capsys) -> None:
    code, doc = idle_json(capsys, "--stop-after", "5")
    assert (
        code == 0 and doc["stopping"] is False and doc["blocked_by"] == [] and doc["threshold_minutes"] == 5
    )
    assert set(doc) - {"rigctl", "command", "ok", "lines"} == documented("idle")
    age_state(idle_rig.dir, 5)
    code, doc = idle_json(capsys, "--stop-after", "5")
    assert code == 0 and doc["stopping"] is True and doc["minutes_idle"] >= 5
    assert ["logger", "-t", "gemma-rig-idle", "--", doc["line"]] in idle_rig
    assert idle_rig[-1] == ["systemctl", "poweroff"]


def test_work_in_hand_a_swap_or_a_start_keeps_the_rig_up(idle_rig, capsys) -> None:
    idle_json(capsys, "--stop-after", "1")
    age_state(idle_rig.dir, 60)
    idle_rig.metrics.page = vllm_page(running=1, success=3, tokens=40)
    doc = idle_json(capsys, "--stop-after", "1")[1]
    assert doc["stopping"] is False and doc["blocked_by"] == ["requests running: 1"]
    idle_rig.metrics.page = vllm_page(success=3, tokens=40)
    (idle_rig.dir / "swap.json").write_text(json.dumps({"from": "a", "to": "b", "phase": "staging"}))
    age_state(idle_rig.dir, 60)
    assert idle_json(capsys, "--stop-after", "1")[1]["blocked_by"] == ["a swap is in progress (staging)"]
    (idle_rig.dir / "swap.json").write_text(json.dumps({"from": "a", "to": "b", "phase": "committed"}))
    idle_rig.props["ActiveState"] = "activating"
    assert idle_json(capsys, "--stop-after", "1")[1]["blocked_by"] == ["svc is activating"]
    assert ["systemctl", "poweroff"] not in idle_rig


@pytest.mark.parametrize(
    "page", ["", "vllm:num_requests_running NaN\n", "\udcff\x00" * 1000, "x" * (9 << 20)]
)
def test_a_hostile_metrics_page_never_crashes_the_timer_or_stops_the_rig(idle_rig, capsys, page: str) -> None:
    idle_json(capsys, "--stop-after", "1")
    age_state(idle_rig.dir, 60)
    idle_rig.metrics.page = page
    code, doc = idle_json(capsys, "--stop-after", "1")
    assert code == 0 and doc["stopping"] is False and len(doc["blocked_by"]) == 1
    assert doc["blocked_by"][0].startswith("/metrics")
    assert ["systemctl", "poweroff"] not in idle_rig


def test_status_carries_the_timers_last_decision(idle_rig, capsys) -> None:
    rigctl.main(["status", "--json"])
    off = json.loads(capsys.readouterr().out)["idle"]
    assert off["enabled"] is False and off["line"] == "off"
    idle_json(capsys, "--stop-after", "7")
    rigctl.main(["status", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["idle"]["enabled"] is True and doc["idle"]["threshold_minutes"] == 7
    assert f"idle stop: {doc['idle']['line']}" in doc["lines"]


def idle_play(tmp_path: Path, platform: str, minutes: int, *args: str):
    """vllm_service's tasks/idle.yml for one host of ``platform``, its units written under tmp_path
    (vLLM not started here, so no systemctl runs)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"rigs": {"children": {platform: {"hosts": {"rig-test": {}}}}}}))
    play = tmp_path / "play.yml"
    task = {
        "name": "Idle timer",
        "ansible.builtin.include_role": {"name": "vllm_service", "tasks_from": "idle"},
    }
    play.write_text(yaml.safe_dump([{"hosts": "rig-test", "gather_facts": False, "tasks": [task]}]))
    evars = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python"),
             "_vllm_service_systemd_dir": str(tmp_path), "vllm_service_swap_state_dir": str(tmp_path),
             "vllm_service_start": False, "rig_idle_stop_minutes": minutes}  # fmt: skip
    return run_playbook(str(play), *args, "-i", "inventory/local.yml", inventory=inventory, extra_vars=evars)


@pytest.mark.slow  # one ansible-playbook run per step
def test_the_role_installs_the_timer_only_when_set_and_removes_it(tmp_path: Path) -> None:
    units = [tmp_path / "vllm-idle.service", tmp_path / "vllm-idle.timer"]
    check = idle_play(tmp_path, "local", 5, "--check")
    assert check.rc == 0 and check.total("changed") == 1 and not any(u.exists() for u in units), check.output[
        -3000:
    ]
    first = idle_play(tmp_path, "local", 5)
    assert first.rc == 0 and first.total("changed") == 1, first.output[-3000:]
    service = units[0].read_text()
    assert "ExecStart=/usr/local/bin/rigctl idle --stop-after 5\n" in service
    # The poweroff stops this unit while rigctl may still run in it: no default 90 s wait there.
    assert "TimeoutStopSec=10\nKillMode=process\n" in service
    assert "OnUnitActiveSec=30\n" in units[1].read_text()
    again = idle_play(tmp_path, "local", 5)
    assert again.rc == 0 and again.total("changed") == 0, again.output[-3000:]
    (tmp_path / "idle.json").write_text("{}")
    off = idle_play(tmp_path, "local", 0)
    assert off.rc == 0 and off.total("changed") == 1, off.output[-3000:]
    assert not any(p.exists() for p in [*units, tmp_path / "idle.json"])
    off_again = idle_play(tmp_path, "local", 0)
    assert off_again.rc == 0 and off_again.total("changed") == 0, off_again.output[-3000:]


@pytest.mark.slow
def test_tpu_refuses_an_idle_stop_naming_why(tmp_path: Path) -> None:
    run = idle_play(tmp_path, "tpu", 5)
    assert run.rc != 0 and "does not stop its node" in run.output and "docs/idle.md" in run.output
    assert not (tmp_path / "vllm-idle.service").exists()


def test_an_unwritable_state_folder_is_a_one_line_error(idle_rig, capsys) -> None:
    rigctl.SETTINGS["swap_state_dir"] = str(idle_rig.dir / "missing")
    code, doc = idle_json(capsys, "--stop-after", "1")
    assert code == rigctl.EXIT_NO_CONFIG and doc["error"].startswith("cannot write ")
    assert ["systemctl", "poweroff"] not in idle_rig
