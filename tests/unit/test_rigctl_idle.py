"""rigctl's idle check (docs/idle.md), on this machine: the metric names against the installed vLLM's
own source, a /metrics page as prometheus_client writes it, the decision (what counts as idle, what
blocks it, when it stops), hostile /metrics pages that never crash it or stop the rig, and `rigctl
idle` / `status` JSON against docs/mcp.md. The real rig runs it in tests/e2e/test_97_idle.py."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

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


@pytest.mark.parametrize("since", [True, "x", 9e99, float("nan"), None])
def test_a_bad_not_serving_time_starts_that_count_again(since) -> None:
    down = {**seen(blocks=("svc is failed",), counters=()), "not_serving": "svc is failed", "boot": "b"}
    before = {"boot": "b", "not_serving_since": since}
    state = rigctl.idle_decide(before, down, 60.0, 1, 30)
    assert (state["not_serving_since"], state["stop"]) == (60.0, False)


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
    clock: list[float]  # rigctl's time.time(): each check's `now`, set by the test
    boot: str  # what rigctl.this_boot() says


@pytest.fixture
def idle_rig(tmp_path: Path, monkeypatch):
    """rigctl's settings, tpu.env with a key, a unit and a stand-in /metrics; returns the calls made."""
    monkeypatch.setattr(rigctl, "SETTINGS", {"unit": "svc", "env_file": str(tmp_path / "tpu.env"),
                                             "helper_dir": str(tmp_path), "python": "/p",
                                             "swap_state_dir": str(tmp_path)})  # fmt: skip
    monkeypatch.setattr(rigctl, "bench_running", lambda proc="/proc": False)
    calls = Calls()
    calls.clock, calls.boot = [time.time()], "boot-1/100"
    # rigctl's own clock and boot only: the test sets each check's time, no sleeps.
    monkeypatch.setattr(rigctl, "time", SimpleNamespace(time=lambda: calls.clock[0], monotonic=time.monotonic,
                                                        sleep=time.sleep))  # fmt: skip
    monkeypatch.setattr(rigctl, "this_boot", lambda proc="/proc": calls.boot)
    metrics = Metrics(vllm_page(success=3, tokens=40))
    (tmp_path / "tpu.env").write_text(f"RIG_PORT={metrics.port}\nVLLM_API_KEY=k\n")
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
    # The start allowance is the vLLM unit's own start deadline (vllm_service_start_timeout).
    assert "ExecStart=/usr/local/bin/rigctl idle --stop-after 5 --start-allowance 900\n" in service
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


@pytest.mark.slow
def test_an_idle_stop_without_a_start_deadline_is_refused(tmp_path: Path) -> None:
    """systemd reads TimeoutStartSec=0 as no deadline; as a start allowance it would count a start
    from its first second."""
    run = idle_play(tmp_path, "local", 5, "-e", "vllm_service_start_timeout=0")
    assert run.rc != 0 and "vllm_service_start_timeout is 0" in run.output, run.output[-3000:]
    assert not (tmp_path / "vllm-idle.service").exists()


def test_an_unwritable_state_folder_is_a_one_line_error(idle_rig, capsys) -> None:
    rigctl.SETTINGS["swap_state_dir"] = str(idle_rig.dir / "missing")
    code, doc = idle_json(capsys, "--stop-after", "1")
    assert code == rigctl.EXIT_NO_CONFIG and doc["error"].startswith("cannot write ")
    assert ["systemctl", "poweroff"] not in idle_rig


# Not serving (docs/idle.md): a vLLM that cannot serve counts toward the idle stop after the start
# allowance, so a rig a wake started that never serves stops too. ALLOWANCE + MINUTES is the limit.
ALLOWANCE, MINUTES = 300, 2
LIMIT = ALLOWANCE + MINUTES * 60
T0 = 1_000_000.0


def check(rig: Calls, capsys, at: float, *argv: str) -> dict:
    """One timer check at time ``at`` (the timer's options unless ``argv`` is given)."""
    rig.clock[0] = at
    code, doc = idle_json(
        capsys, *(argv or ("--stop-after", str(MINUTES), "--start-allowance", str(ALLOWANCE)))
    )
    assert code == 0, doc
    return doc


def refusing_port() -> socket.socket:
    """A port bound and never listened on: Linux refuses connections to it, and no one else gets it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(params=["failed", "activating", "refused", "http error"])
def cannot_serve(request, idle_rig: Calls):
    """The rig in one way of not serving: its unit failed or stuck starting, or active with a /metrics
    that refuses connections or answers an HTTP error (a key the page refuses). Returns the words."""
    closed = refusing_port()
    if request.param in ("failed", "activating"):
        idle_rig.props["ActiveState"] = request.param
        words = f"svc is {request.param}"
    elif request.param == "refused":
        (idle_rig.dir / "tpu.env").write_text(f"RIG_PORT={closed.getsockname()[1]}\nVLLM_API_KEY=k\n")
        words = "/metrics unreadable: [Errno 111] Connection refused"
    else:
        (idle_rig.dir / "tpu.env").write_text(f"RIG_PORT={idle_rig.metrics.port}\nVLLM_API_KEY=other\n")
        words = "/metrics unreadable: Unauthorized"
    yield words
    closed.close()


def serve_again(rig: Calls) -> None:
    rig.props["ActiveState"] = "active"
    (rig.dir / "tpu.env").write_text(f"RIG_PORT={rig.metrics.port}\nVLLM_API_KEY=k\n")


def test_a_rig_that_cannot_serve_stops_after_its_start_allowance_and_the_idle_minutes(
    idle_rig, capsys, cannot_serve: str
) -> None:
    first = check(idle_rig, capsys, T0)
    assert first["not_serving_minutes"] == 0 and first["start_allowance_seconds"] == ALLOWANCE
    assert first["blocked_by"] == [cannot_serve] and first["minutes_idle"] == 0
    # Checks every 30 s up to a second before the limit: counted, never a stop.
    for at in [T0 + s for s in range(30, LIMIT, 30)] + [T0 + LIMIT - 1]:
        doc = check(idle_rig, capsys, at)
        assert doc["stopping"] is False and doc["not_serving_minutes"] == round((at - T0) / 60, 2), doc
    assert (
        doc["line"]
        == f"not serving: {cannot_serve} since 7.0 min (stops after 7 min: 5 min to start + 2 idle)"
    )
    assert ["systemctl", "poweroff"] not in idle_rig
    done = check(idle_rig, capsys, T0 + LIMIT)
    assert done["stopping"] is True and done["not_serving_minutes"] == 7
    assert (
        done["line"] == f"stopping the rig: not serving: {cannot_serve} since 7.0 min (stops after 7 min: "
        "5 min to start + 2 idle)"
    )
    assert idle_rig[-2:] == [
        ["logger", "-t", "gemma-rig-idle", "--", done["line"]],
        ["systemctl", "poweroff"],
    ]


def test_a_crash_loop_keeps_counting_across_its_restarts(idle_rig, capsys) -> None:
    idle_rig.props["ActiveState"] = "activating"
    check(idle_rig, capsys, T0)
    for n, at in enumerate(range(60, LIMIT, 60)):  # each restart is a new invocation
        idle_rig.props["InvocationID"] = f"i{n + 2}"
        idle_rig.props["ActiveState"] = ("failed", "activating")[n % 2]
        assert check(idle_rig, capsys, T0 + at)["stopping"] is False
    assert check(idle_rig, capsys, T0 + LIMIT)["stopping"] is True


def test_a_normal_start_inside_the_allowance_never_stops_the_rig(idle_rig, capsys) -> None:
    """The local CPU vLLM's start (30-60 s) under test_98's 1-minute threshold and the default 900 s
    allowance: activating, then active while it loads (/metrics refused), then serving."""
    closed = refusing_port()
    timer = ("--stop-after", "1", "--start-allowance", "900")
    idle_rig.props["ActiveState"] = "activating"
    assert check(idle_rig, capsys, T0, *timer)["not_serving_minutes"] == 0
    idle_rig.props["ActiveState"] = "active"
    (idle_rig.dir / "tpu.env").write_text(f"RIG_PORT={closed.getsockname()[1]}\nVLLM_API_KEY=k\n")
    loading = check(idle_rig, capsys, T0 + 30, *timer)
    assert loading["not_serving_minutes"] == 0.5 and loading["line"].startswith(
        "not serving: /metrics unreadable"
    )
    serve_again(idle_rig)
    closed.close()
    up = check(idle_rig, capsys, T0 + 60, *timer)
    assert (up["not_serving_minutes"], up["line"], up["stopping"]) == (None, "idle 0 min of 1", False)
    # From here only the served-nothing count runs, from the first check that found vLLM serving.
    assert check(idle_rig, capsys, T0 + 119, *timer)["stopping"] is False
    assert check(idle_rig, capsys, T0 + 120, *timer)["line"] == "stopping the rig: idle 1 min of 1"


def test_serving_again_starts_the_not_serving_count_again(idle_rig, capsys, cannot_serve: str) -> None:
    check(idle_rig, capsys, T0)
    assert check(idle_rig, capsys, T0 + LIMIT - 1)["stopping"] is False
    serve_again(idle_rig)
    assert check(idle_rig, capsys, T0 + LIMIT)["not_serving_minutes"] is None
    idle_rig.props["ActiveState"] = "failed"
    again = check(idle_rig, capsys, T0 + LIMIT + 30)
    assert again["not_serving_minutes"] == 0 and again["stopping"] is False
    assert check(idle_rig, capsys, T0 + 2 * LIMIT + 29)["stopping"] is False
    assert check(idle_rig, capsys, T0 + 2 * LIMIT + 30)["stopping"] is True


@pytest.mark.parametrize("holder", ["swap", "bench", "garbage page"])
def test_a_swap_a_bench_or_a_bad_page_holds_the_not_serving_count(
    idle_rig, capsys, monkeypatch, holder: str
) -> None:
    """A swap restarts vLLM and a bench may find it down: neither counts as a vLLM that cannot
    serve, and the count starts again after them. A page that answers is not a vLLM that is down."""
    if holder == "garbage page":
        idle_rig.metrics.page = "\x00 garbage {{{\n"
    else:
        idle_rig.props["ActiveState"] = "failed"
    if holder == "swap":
        (idle_rig.dir / "swap.json").write_text(json.dumps({"from": "a", "to": "b", "phase": "switching"}))
    if holder == "bench":
        monkeypatch.setattr(rigctl, "bench_running", lambda proc="/proc": True)
    for at in range(0, 3 * LIMIT, 30):
        doc = check(idle_rig, capsys, T0 + at)
        assert doc["stopping"] is False and doc["not_serving_minutes"] is None, doc
        assert doc["line"].startswith("not idle: ")
    assert ["systemctl", "poweroff"] not in idle_rig
    if holder == "garbage page":
        assert doc["blocked_by"][0].startswith("/metrics lacks")
        return
    # Once the swap or bench is over, a vLLM still down counts from then.
    (idle_rig.dir / "swap.json").write_text(json.dumps({"from": "a", "to": "b", "phase": "committed"}))
    monkeypatch.setattr(rigctl, "bench_running", lambda proc="/proc": False)
    after = T0 + 3 * LIMIT
    assert check(idle_rig, capsys, after)["not_serving_minutes"] == 0
    assert check(idle_rig, capsys, after + LIMIT - 1)["stopping"] is False
    assert check(idle_rig, capsys, after + LIMIT)["stopping"] is True


def test_a_count_from_another_boot_or_timer_run_starts_again(idle_rig, capsys) -> None:
    """A rig woken after an idle poweroff finds the state of its last boot, a repaired one the state
    from before its timer was stopped: the allowance is whole."""
    idle_rig.props["ActiveState"] = "activating"
    check(idle_rig, capsys, T0)
    assert check(idle_rig, capsys, T0 + LIMIT - 1)["stopping"] is False
    idle_rig.boot = "boot-1/5000"  # the container started again on the same kernel: a new PID 1
    woken = check(idle_rig, capsys, T0 + LIMIT + 600)
    assert woken["not_serving_minutes"] == 0 and woken["stopping"] is False
    assert check(idle_rig, capsys, T0 + 2 * LIMIT + 599)["stopping"] is False
    assert check(idle_rig, capsys, T0 + 2 * LIMIT + 600)["stopping"] is True
    # The idle timer stopped (a person repairing the rig) and started again: the count from before
    # the pause would stop a rig whose vLLM is only now starting.
    idle_rig.props["ActiveEnterTimestampMonotonic"] = "123456"  # what `systemctl show` says of the timer
    resumed = check(idle_rig, capsys, T0 + 5 * LIMIT)
    assert resumed["not_serving_minutes"] == 0 and resumed["stopping"] is False
    assert check(idle_rig, capsys, T0 + 6 * LIMIT)["stopping"] is True
    # A boot that cannot be read carries nothing over.
    idle_rig.boot = ""
    assert check(idle_rig, capsys, T0 + 9 * LIMIT)["not_serving_minutes"] == 0
    assert check(idle_rig, capsys, T0 + 19 * LIMIT)["not_serving_minutes"] == 0


def test_this_boot_is_the_kernels_boot_and_pid_1s_start(tmp_path: Path) -> None:
    def proc(boot: str, stat: str) -> str:
        folder = tmp_path / f"proc-{len(list(tmp_path.iterdir()))}"
        (folder / "sys/kernel/random").mkdir(parents=True)
        (folder / "sys/kernel/random/boot_id").write_text(boot + "\n")
        (folder / "1").mkdir()
        (folder / "1/stat").write_text(stat)
        return str(folder)

    rest = "S 0 0 0 0 -1 4194560 1 2 0 0 3 4 5 6 20 0 1 0 {start} 1 2 3\n"
    host = rigctl.this_boot(proc("b1", "1 (systemd) " + rest.format(start=31)))
    assert host == "b1/31"
    # The container again: the same kernel, its PID 1 later; a name with spaces and parentheses.
    assert rigctl.this_boot(proc("b1", "1 (sys) (temd) " + rest.format(start=9000))) == "b1/9000"
    assert rigctl.this_boot(proc("b1", "1 (systemd) S 0\n")) == ""
    assert rigctl.this_boot(str(tmp_path / "none")) == ""
    # This machine's own: read, and the same twice.
    assert rigctl.this_boot() and rigctl.this_boot() == rigctl.this_boot()


def test_a_manual_check_reports_with_the_timers_allowance(idle_rig, capsys) -> None:
    idle_rig.props["ActiveState"] = "failed"
    check(idle_rig, capsys, T0)
    manual = check(idle_rig, capsys, T0 + 10 * LIMIT, "--start-allowance", "60")
    assert manual["stopping"] is False and manual["start_allowance_seconds"] == 60
    kept = check(idle_rig, capsys, T0 + 10 * LIMIT + 30, "--stop-after", "2")
    assert kept["start_allowance_seconds"] == 60 and kept["stopping"] is True


@pytest.mark.parametrize("allowance", ["0", "-5", "15m", ""])
def test_a_bad_start_allowance_is_a_usage_error(idle_rig, capsys, allowance: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        rigctl.main(["idle", "--stop-after", "1", "--start-allowance", allowance])
    assert exit_.value.code == rigctl.EXIT_USAGE and "--start-allowance" in capsys.readouterr().err


def test_status_carries_the_not_serving_count(idle_rig, capsys) -> None:
    idle_rig.props["ActiveState"] = "failed"
    check(idle_rig, capsys, T0)
    line = check(idle_rig, capsys, T0 + 90)["line"]
    rigctl.main(["status", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["idle"]["not_serving_minutes"] == 1.5 and doc["idle"]["start_allowance_seconds"] == ALLOWANCE
    assert f"idle stop: {line}" in doc["lines"] and line.startswith(
        "not serving: svc is failed since 1.5 min"
    )


def test_a_state_that_cannot_be_written_still_stops_a_rig_that_never_serves(idle_rig, capsys) -> None:
    """A full disk fails the write; the count already written holds, and the stop goes ahead."""
    idle_rig.props["ActiveState"] = "failed"
    check(idle_rig, capsys, T0)
    (idle_rig.dir / "idle.json.new").mkdir()  # the write fails as on a full disk
    idle_rig.clock[0] = T0 + LIMIT - 1
    code, doc = idle_json(capsys, "--stop-after", str(MINUTES), "--start-allowance", str(ALLOWANCE))
    assert code == rigctl.EXIT_NO_CONFIG and doc["error"].startswith("cannot write ")
    assert ["systemctl", "poweroff"] not in idle_rig
    idle_rig.clock[0] = T0 + LIMIT
    code, doc = idle_json(capsys, "--stop-after", str(MINUTES), "--start-allowance", str(ALLOWANCE))
    assert code == rigctl.EXIT_NO_CONFIG and idle_rig[-1] == ["systemctl", "poweroff"]


def test_a_page_cut_short_is_not_serving_and_never_a_crash(idle_rig, capsys) -> None:
    """http.client's own errors (a chunked body cut short, a status line that is not HTTP)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer() -> None:
        for reply in (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n99\r\nvllm:",
            b"\x1b[31mnot http\r\n\r\n",
        ):
            conn, _ = server.accept()
            conn.recv(65536)
            conn.sendall(reply)
            conn.close()

    worker = threading.Thread(target=answer, daemon=True)
    worker.start()
    (idle_rig.dir / "tpu.env").write_text(f"RIG_PORT={server.getsockname()[1]}\nVLLM_API_KEY=k\n")
    for at in (T0, T0 + 30):
        doc = check(idle_rig, capsys, at)
        assert doc["not_serving_minutes"] is not None and doc["blocked_by"][0].startswith(
            "/metrics unreadable: "
        )
        assert "\x1b" not in doc["line"] and "\n" not in doc["line"]
    worker.join(timeout=10)
    server.close()
