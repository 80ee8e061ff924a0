"""rigctl, the one place that works out a rig's state, on this machine: systemctl and journalctl
answered from a table, vLLM a FakeRig, the code checks real scripts in a helper folder; each
command's --json object against the schema in docs/mcp.md, hostile values the rig holds carried
byte for byte; then status.yml showing a rigctl report as data. The real rig runs them in
tests/e2e/test_30_rigctl_mcp.py."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.conftest import ROOT, VENV_BIN
from tests.fake_rig import FakeRig

_spec = importlib.util.spec_from_file_location("rigctl", ROOT / "roles/vllm_service/files/rigctl.py")
rigctl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rigctl)

HOSTILE = "{{ lookup('pipe', 'touch MARKER') }} $(touch MARKER) \"q\" \\ 東京"
FREE = "              total        used\nMem:           7.8Gi       2.1Gi\nSwap:          2.0Gi       0B\n"


class Host:
    """The rig's commands as rigctl runs them: systemctl's unit properties (changed by start and
    stop), the journal, free and uptime; anything else (the code checks) really runs."""

    def __init__(self, props: dict[str, str], journal: str = "") -> None:
        self.props = {"LoadState": "loaded", **props}
        self.journal = journal
        self.calls: list[list[str]] = []
        self.on_start = {"ActiveState": "active", "SubState": "running"}

    def __call__(self, cmd, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = list(cmd)
        self.calls.append(cmd)
        out = ""
        if cmd[:2] == ["systemctl", "show"]:
            out = "".join(f"{k}={v}\n" for k, v in self.props.items())
        elif cmd[:2] in (["systemctl", "start"], ["systemctl", "restart"]):
            self.props.update(self.on_start)
        elif cmd[:2] == ["systemctl", "stop"]:
            self.props.update(ActiveState="inactive", SubState="dead")
        elif cmd[0] == "journalctl":
            out = self.journal
        elif cmd[0] == "free":
            out = FREE
        elif cmd[0] == "uptime":
            out = "up 3 hours\n"
        else:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        return subprocess.CompletedProcess(cmd, 0, out, "")


def _checks(folder: Path, **words_rc: tuple[str, int]) -> None:
    """Code checks in the helper folder (Python scripts, as rigctl runs them): file -> (words, rc)."""
    for file, (words, rc) in words_rc.items():
        (folder / file).write_text(f"import sys\nprint({words!r})\nsys.exit({rc})\n")


@pytest.fixture
def rig(tmp_path: Path, monkeypatch):
    """SETTINGS as the role writes them, tpu.env, a swap journal; returns a function that installs
    a Host and a tpu.env for a FakeRig's port."""
    helper = tmp_path / "libexec"
    helper.mkdir()
    monkeypatch.setattr(
        rigctl,
        "SETTINGS",
        {"unit": "svc", "env_file": str(tmp_path / "tpu.env"), "helper_dir": str(helper),
         "python": sys.executable, "swap_state_dir": str(tmp_path)},
    )  # fmt: skip
    monkeypatch.setattr(rigctl.time, "sleep", lambda s: None)

    def install(port: int, props: dict[str, str], journal: str = "", served: str = "") -> Host:
        (tmp_path / "tpu.env").write_text(f"RIG_PORT={port}\nRIG_SERVED_MODEL_NAME={served}\n")
        host = Host(props, journal)
        monkeypatch.setattr(rigctl, "run", host)
        return host

    install.helper, install.dir = helper, tmp_path
    return install


def documented(command: str) -> set[str]:
    """The fields docs/mcp.md's --json table gives ``command`` (besides rigctl, command, ok, lines)."""
    rows = [r.split("|") for r in (ROOT / "docs/mcp.md").read_text().splitlines() if r.startswith("| `")]
    row = next(r for r in rows if f"`{command}`" in r[1] and "`lines`" not in r[2] and len(r) == 4)
    return set(re.findall(r"`([a-z_]+)`", row[2]))


def rigctl_json(capsys, *argv: str) -> tuple[int, dict]:
    """rigctl ARGV --json: its exit code and its one JSON object (all of stdout)."""
    code = rigctl.main([*argv, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["rigctl"] == rigctl.SCHEMA and doc["command"] == argv[0]
    assert doc["ok"] is (code == 0)
    return code, doc


def test_status_json_on_a_serving_rig_carries_what_the_rig_holds(rig, capsys) -> None:
    _checks(rig.helper, **{"clamp-check": ("clamp-check: turing clamp present once", 0)})
    (rig.dir / "swap.json").write_text(json.dumps({"from": HOSTILE, "to": "b", "phase": "committed", "x": 1}))
    journal = f"{HOSTILE}\nKV cache size: 12,345 tokens\n"
    with FakeRig(HOSTILE, alias="alias-" + HOSTILE) as fake:
        rig(fake.port, {"ActiveState": "active", "SubState": "running", "NRestarts": "2",
                        "ActiveEnterTimestamp": "Thu 2026-01-01", "InvocationID": "abc"}, journal)  # fmt: skip
        code, doc = rigctl_json(capsys, "status", "--expect-model", "tiny")
        assert rigctl.main(["status", "--expect-model", "tiny"]) == 0  # the text form: the same lines
        text = capsys.readouterr().out
    assert code == 0 and doc["serving"] is True
    assert doc["service"] == {"active": "active", "sub": "running", "since": "Thu 2026-01-01",
                              "result": None, "restarts": 2, "gave_up": False, "reason": None}  # fmt: skip
    assert doc["last_swap"] == {"from": HOSTILE, "to": "b", "phase": "committed"}
    assert (doc["health"], doc["models_status"]) == (200, 200)
    assert doc["build"] == HOSTILE and doc["aliases"] == ["alias-" + HOSTILE]
    assert doc["kv_cache_tokens"] == 12345
    assert doc["checks"] == [{"name": "clamp", "ok": True, "words": "clamp-check: turing clamp present once"}]
    assert doc["host"] == ["cpu: 2.1Gi used of 7.8Gi", "swap: 0B used of 2.0Gi", "uptime: up 3 hours"]
    assert doc["lines"] == [
        "service: active/running since Thu 2026-01-01",
        "restarts: 2",
        f"last swap: {HOSTILE} -> b, committed",
        "health: ok",
        f"model: {HOSTILE} (also answers to alias-{HOSTILE}) (the inventory says tiny: swapped since site.yml)",
        "KV cache tokens: 12,345",
        "clamp: present once",
        *doc["host"],
    ]
    assert text == "\n".join(doc["lines"]) + "\n"


def test_status_of_a_unit_that_gave_up_names_why(rig, capsys) -> None:
    _checks(rig.helper, **{"clamp-check": ("clamp-check: turing clamp missing from f", 1)})
    journal = (
        "2026-01-01T00:00:00 h systemd[1]: vllm.service: Start request repeated too quickly.\n"
        f"2026-01-01T00:00:00 h python[9]: clamp-check: turing clamp missing {HOSTILE}\n"
    )
    rig(1, {"ActiveState": "failed", "SubState": "failed", "Result": "start-limit-hit"}, journal)
    code, doc = rigctl_json(capsys, "status")
    assert code == rigctl.EXIT_NOT_SERVING and doc["serving"] is False
    assert (
        doc["service"]["gave_up"] is True
        and doc["service"]["reason"] == f"clamp-check: turing clamp missing {HOSTILE}"
    )
    assert (doc["health"], doc["build"], doc["aliases"], doc["last_swap"]) == (-1, None, [], None)
    assert doc["kv_cache_tokens"] is None
    assert doc["checks"][0]["ok"] is False
    assert doc["lines"][1] == (
        "gave up after repeated failed starts (start limit hit; no more automatic restarts: fix the "
        f"cause, then playbooks/start.yml): clamp-check: turing clamp missing {HOSTILE}"
    )
    assert "model: none answering" in doc["lines"]
    assert "clamp: MISSING OR DUPLICATED: clamp-check: turing clamp missing from f" in doc["lines"]


def test_start_restart_and_stop_json(rig, capsys) -> None:
    with FakeRig("m", alias="a") as fake:
        host = rig(fake.port, {"ActiveState": "inactive", "SubState": "dead", "NRestarts": "0"}, served="m")
        code, doc = rigctl_json(capsys, "start")
        assert code == 0 and doc["changed"] is True and doc["build"] == "m"
        assert doc["url"] == f"http://127.0.0.1:{fake.port}"
        assert doc["lines"] == [f"svc: serving m on http://127.0.0.1:{fake.port}"]
        assert [c[:2] for c in host.calls if c[0] == "systemctl" and c[1] != "show"] == [
            ["systemctl", "reset-failed"],
            ["systemctl", "start"],
        ]
        assert [e["path"] for e in fake.log][-1] == "/v1/chat/completions"  # a short chat proves it serves
        assert set(doc) - {"rigctl", "command", "ok", "lines"} == documented("start") == documented("restart")
        code, doc = rigctl_json(capsys, "restart", "--no-wait")
        assert (code, doc["changed"], doc["build"], doc["lines"]) == (
            0,
            True,
            None,
            ["svc: restart requested"],
        )
        code, doc = rigctl_json(capsys, "stop")
        assert (code, doc["changed"], doc["lines"]) == (0, True, ["svc: stopped"])
        code, doc = rigctl_json(capsys, "stop")
        assert doc["changed"] is False


def test_a_start_that_dies_or_serves_another_name_fails(rig, capsys) -> None:
    with FakeRig("m") as fake:
        host = rig(fake.port, {"ActiveState": "inactive", "NRestarts": "0"}, journal=HOSTILE, served="m")
        host.on_start = {"ActiveState": "activating", "NRestarts": "1"}
        code, doc = rigctl_json(capsys, "restart")
        assert code == 1 and doc["exit"] == 1
        assert doc["error"] == (
            f"vLLM exited while starting (automatic restarts: 1, unit: activating); its last lines:\n{HOSTILE}"
        )
        rig(fake.port, {"ActiveState": "inactive", "NRestarts": "0"}, served="another")
        code, doc = rigctl_json(capsys, "start", "--timeout", "0.5")
        assert code == 1 and doc["error"] == "svc did not list another on /v1/models within 0 s"
    assert capsys.readouterr().err == ""  # read by rigctl_json; each failure also says it on stderr


def test_logs_query_and_clamp_json(rig, capsys) -> None:
    _checks(rig.helper, **{"tpu_inference_patch.py": ("patched", 0)})
    with FakeRig(HOSTILE) as fake:
        rig(fake.port, {"ActiveState": "active"}, journal=f"one\n{HOSTILE}\n")
        code, doc = rigctl_json(capsys, "logs", "-n", "2")
        assert code == 0 and doc["lines"] == ["one", HOSTILE]
        code, doc = rigctl_json(capsys, "query", "hi", "--max-tokens", "4")
        assert code == 0 and (doc["model"], doc["answer"], doc["reasoning_only"]) == (HOSTILE, "Paris", False)
        assert doc["finish_reason"] == "stop" and doc["usage"]["completion_tokens"] == 1
        assert doc["lines"] == [f"{HOSTILE}: Paris", "tokens: 5 in, 1 out"]
    code, doc = rigctl_json(capsys, "clamp")
    assert code == 0 and doc["checks"] == [{"name": "tpu-inference patch", "ok": True, "words": "patched"}]
    assert doc["lines"] == ["clamp: not used on this platform", "tpu-inference patch: present"]


def test_code_checks_run_what_the_helper_folder_holds(rig, capsys) -> None:
    rig(1, {})
    code, doc = rigctl_json(capsys, "clamp")  # none installed: nothing would stop an unpatched start
    assert code == 1 and doc["checks"] == []
    assert doc["lines"] == [f"clamp: MISSING: no clamp or tpu-inference patch check in {rig.helper}"]
    # The real tpu-inference check, against a Python without tpu_inference: it fails and says why.
    (rig.helper / "tpu_inference_patch.py").write_bytes(
        (ROOT / "module_utils/tpu_inference_patch.py").read_bytes()
    )
    code, doc = rigctl_json(capsys, "clamp")
    assert code == 1 and doc["lines"][0] == "clamp: not used on this platform"
    assert doc["lines"][1].startswith("tpu-inference patch: MISSING: ") and doc["checks"][0]["words"]


def test_errors_and_bad_arguments(rig, tmp_path: Path, capsys) -> None:
    rig(1, {})
    (rig.dir / "tpu.env").unlink()
    code, doc = rigctl_json(capsys, "status")
    assert code == doc["exit"] == rigctl.EXIT_NO_CONFIG
    assert doc["error"] == f"cannot read {rig.dir / 'tpu.env'}: No such file or directory"
    for argv, words in ((["logs", "-n", "-1"], "must be 0 or more, got -1"),
                        (["logs", "-f", "--json"], "--follow does not go with --json")):  # fmt: skip
        with pytest.raises(SystemExit) as ex:
            rigctl.main(argv)
        assert ex.value.code == rigctl.EXIT_USAGE and words in capsys.readouterr().err


def test_tpu_env_is_read_as_systemd_reads_it(tmp_path: Path) -> None:
    env = tmp_path / "tpu.env"
    env.write_text('# c\nRIG_PORT=8000\nRIG_EXTRA_ARGS="--a \\"b\\" c"\n\nVLLM_API_KEY=k\n')
    assert rigctl.read_env(str(env)) == {
        "RIG_PORT": "8000",
        "RIG_EXTRA_ARGS": '--a "b" c',
        "VLLM_API_KEY": "k",
    }


def test_the_role_writes_the_rigs_names_into_rigctl() -> None:
    """The install task replaces rigctl's SETTINGS line with the rig's names as JSON (a Python
    literal too); from source rigctl names no unit."""
    source = (ROOT / "roles/vllm_service/files/rigctl.py").read_text()
    task = (ROOT / "roles/vllm_service/tasks/main.yml").read_text()
    placeholder = "SETTINGS: dict[str, str] = {}"
    assert source.count(placeholder) == 1 and f"replace('{placeholder}'," in task
    names = {"unit": "u", "env_file": "/e", "helper_dir": "/h", "python": "/p", "swap_state_dir": "/s"}
    installed = source.replace(placeholder, f"SETTINGS: dict[str, str] = {json.dumps(names)}")
    space: dict = {"__name__": "installed"}
    exec(compile(installed, "rigctl", "exec"), space)  # the file the role installs
    assert space["SETTINGS"] == names and set(names) == {
        w for w in ("unit", "env_file", "helper_dir", "python", "swap_state_dir") if f"'{w}':" in task
    }
    # vLLM's metric names (the idle check reads them) begin with its namespace, "vllm:".
    own = source.replace("vLLM", "").replace("vllm_service", "").replace("vllm:", "")
    assert rigctl.SETTINGS == {} and "vllm" not in own


def _play_with_fake_rigctl(tmp_path: Path, playbook: str, report: dict, code: int = 0, *args: str):
    """Run ``playbook`` on a rig whose rigctl prints ``report`` (and ``report["error"]`` on stderr)
    and exits ``code``; (the run, the argv rigctl got). A command given stdin (--request-stdin)
    leaves it in tmp_path/stdin."""
    (tmp_path / "report.json").write_text(json.dumps(report))
    (tmp_path / "error").write_text(f"rigctl: {report['error']}\n" if "error" in report else "")
    fake = tmp_path / "rigctl"
    fake.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\ncase "$*" in *--request-stdin*) cat > {tmp_path}/stdin;; esac\n'
        f"cat {tmp_path}/report.json\ncat {tmp_path}/error >&2\nexit {code}\n"
    )
    fake.chmod(0o755)
    inventory = tmp_path / "inventory"
    inventory.mkdir(exist_ok=True)
    if not (inventory / "group_vars").exists():
        (inventory / "group_vars").symlink_to(ROOT / "inventory" / "group_vars")
    host = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python"),
            "rig_ctl": str(fake), "rig_model": "tiny"}  # fmt: skip
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"rigs": {"hosts": {"r": host}}}))
    run = run_playbook(playbook, *args, inventory=inventory / "hosts.yml", timeout=600)
    return run, (tmp_path / "argv").read_text().splitlines()


def test_status_yml_shows_a_rigctl_report_as_data(tmp_path: Path) -> None:
    """What rigctl reports is the rig's data: status.yml shows it, never renders or runs it; not
    serving (exit 3) is a status, not a failure."""
    marker = tmp_path / "MARKER"
    hostile = HOSTILE.replace("MARKER", str(marker))
    report = {"rigctl": rigctl.SCHEMA, "command": "status", "ok": False, "lines": [f"model: {hostile}"]}
    run, argv = _play_with_fake_rigctl(tmp_path, "playbooks/status.yml", report, 3)
    assert run.rc == 0, run.output[-3000:]
    assert argv == ["status", "--json", "--expect-model", "tiny"]
    said = " ".join(run.output.split())  # the YAML callback folds long lines, doubles single quotes
    assert f"model: {{{{ lookup(''pipe'', ''touch {marker}'') }}}} $(touch {marker}) \"q\" \\ 東京" in said, (
        said
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("playbook", "args", "want"),
    [
        ("start", (), ["start", "--json"]),
        ("restart", (), ["restart", "--json"]),  # start.yml, imported with a restart
        ("stop", (), ["stop", "--json"]),
        ("logs", ("-e", "lines=7"), ["logs", "--json", "--lines", "7"]),
    ],
)
def test_the_ops_playbooks_run_rigctl(tmp_path: Path, playbook: str, args: tuple, want: list[str]) -> None:
    report = {
        "rigctl": rigctl.SCHEMA,
        "command": want[0],
        "ok": True,
        "changed": True,
        "lines": ["svc: said"],
    }
    run, argv = _play_with_fake_rigctl(tmp_path, f"playbooks/{playbook}.yml", report, 0, *args)
    assert run.rc == 0, run.output[-3000:]
    assert argv == want
    assert ("svc: said" in run.output) is (playbook != "stop")


# A prompt no argument could carry: NUL, newlines, Jinja, shell words, over 100 KB.
STDIN_PROMPT = (f"{HOSTILE}\x00\n$(touch x) `y`\n" * 2000)[:102_500]


def _stdin(monkeypatch, request: dict) -> None:
    monkeypatch.setattr(rigctl.sys, "stdin", io.StringIO(json.dumps(request)))


def test_wait_sends_the_prompt_from_stdin_exactly_and_says_the_answer(rig, capsys, monkeypatch) -> None:
    with FakeRig("m", alias="a") as fake:
        rig(fake.port, {"ActiveState": "active", "NRestarts": "3"}, served="other")
        _stdin(monkeypatch, {"prompt": STDIN_PROMPT, "max_tokens": 7})
        code, doc = rigctl_json(capsys, "wait", "--model", "a", "--request-stdin")
        chats = [e for e in fake.log if e["path"] == "/v1/chat/completions"]
        assert chats == [{"path": "/v1/chat/completions", "model": "m", "authorization": None,
                          "messages": [{"role": "user", "content": STDIN_PROMPT}], "max_tokens": 7}]  # fmt: skip
        assert code == 0 and doc["build"] == "m" and doc["chat"]["answer"] == "Paris"
        assert set(doc) - {"rigctl", "command", "ok", "lines"} == documented("wait")
        assert set(doc["chat"]) - {"lines"} == documented("query")
        assert doc["lines"] == [
            f"svc: serving m on http://127.0.0.1:{fake.port}",
            "m: Paris",
            "tokens: 5 in, 1 out",
        ]
        code, doc = rigctl_json(capsys, "wait", "--no-chat", "--timeout", "0.5")  # tpu.env names "other"
        assert code == 1 and doc["error"] == "svc did not list other on /v1/models within 0 s"
        assert [e["path"] for e in fake.log].count("/v1/chat/completions") == 1


def test_wait_fails_at_once_on_a_stopped_unit_with_its_last_lines(rig, capsys) -> None:
    host = rig(1, {"ActiveState": "inactive", "NRestarts": "0"}, journal=HOSTILE)
    code, doc = rigctl_json(capsys, "wait")
    assert code == 1 and doc["error"] == (
        f"vLLM exited while starting (automatic restarts: 0, unit: inactive); its last lines:\n{HOSTILE}"
    )
    assert [c[:2] for c in host.calls].count(["systemctl", "show"]) == 2  # no waiting out the timeout


def test_wait_fails_at_once_while_systemd_waits_to_restart_the_unit(rig, capsys) -> None:
    """vLLM exited and systemd waits RestartSec before the next start (NRestarts not counted yet):
    the wait ends on the first look with the exit's last lines, not after the restart."""
    for sub in ("auto-restart", "auto-restart-queued"):
        host = rig(1, {"ActiveState": "activating", "SubState": sub, "NRestarts": "0"}, journal=HOSTILE)
        code, doc = rigctl_json(capsys, "wait", "--timeout", "2")
        assert code == 1 and doc["error"] == (
            f"vLLM exited while starting (automatic restarts: 0, unit: activating ({sub})); "
            f"its last lines:\n{HOSTILE}"
        )
        assert [c[:2] for c in host.calls].count(["systemctl", "show"]) == 2  # no waiting for the restart


def test_wait_goes_on_while_the_unit_starts(rig, capsys) -> None:
    """A unit still starting (ExecStartPre, then vLLM loading) is no exit: the wait lasts until vLLM
    lists the model. Only `auto-restart` at the start of SubState counts, not a value that holds it."""
    with FakeRig("m") as fake:
        for sub in ("start-pre", "start", "running", "x-auto-restart"):
            rig(fake.port, {"ActiveState": "activating", "SubState": sub, "NRestarts": "0"}, served="m")
            code, doc = rigctl_json(capsys, "wait", "--no-chat", "--timeout", "5")
            assert (code, doc["build"]) == (0, "m"), doc


class Gateway:
    """An endpoint that answers as HAProxy in front of a rig does (x-gemma-rig), or fails the chat."""

    def __init__(self, chat_status: int = 200) -> None:
        self.requests: list[dict] = []
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("x-gemma-rig", "rig-b")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                gw.requests.append({"path": self.path, "authorization": self.headers.get("Authorization")})
                self._send(200, {"data": [{"id": "m"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                gw.requests.append(
                    {"path": self.path, "authorization": self.headers.get("Authorization"), **body}
                )
                # With tools: the call vLLM's parser makes of the first tool, its name and arguments as given.
                calls = (
                    [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {
                                "name": body["tools"][0]["function"]["name"],
                                "arguments": HOSTILE_ARGS,
                            },
                        }
                    ]
                    if body.get("tools")
                    else None
                )
                self._send(chat_status, {"model": "m", "usage": {}, "choices": [
                    {"finish_reason": "tool_calls" if calls else "length",
                     "message": {"content": "", "reasoning_content": "hmm", "tool_calls": calls}}]})  # fmt: skip

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_query_url_reads_the_key_from_stdin_and_names_the_rig_that_answered(capsys, monkeypatch) -> None:
    gw = Gateway()
    _stdin(monkeypatch, {"prompt": STDIN_PROMPT, "max_tokens": 9, "api_key": "sk-SECRET"})
    code, doc = rigctl_json(capsys, "query", "--request-stdin", "--url", gw.url)
    assert code == 0 and gw.requests[-1]["messages"] == [{"role": "user", "content": STDIN_PROMPT}]
    assert {r["authorization"] for r in gw.requests} == {"Bearer sk-SECRET"} and gw.requests[-1][
        "max_tokens"
    ] == 9
    assert (doc["answer"], doc["reasoning_only"], doc["reasoning_chars"], doc["answered_by"]) == (
        "",
        True,
        3,
        "rig-b",
    )
    assert doc["lines"] == ["m: ", "(reasoning only: no answer within max_tokens=9, finish_reason length)",
                            "tokens: None in, None out", f"answered by rig-b through {gw.url}"]  # fmt: skip
    assert "sk-SECRET" not in json.dumps(doc)
    assert set(doc) - {"rigctl", "command", "ok", "lines"} == documented("query")
    # No option carries a key: it comes on stdin only.
    commands = next(a for a in rigctl.parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert not [o for c in commands.values() for a in c._actions for o in a.option_strings if "key" in o]
    _stdin(monkeypatch, {"prompt": "hi"})
    code, doc = rigctl_json(capsys, "query", "--request-stdin", "--url", Gateway(chat_status=500).url)
    assert code == 1 and doc["error"].endswith("/v1/models but a chat completion failed (status 500)")
    _stdin(monkeypatch, {"prompt": "hi"})
    code, doc = rigctl_json(
        capsys, "query", "--request-stdin", "--url", gw.url, "--ca-file", "/nonexistent/ca.crt"
    )
    assert code == 1 and doc["error"].startswith("cannot use the CA file /nonexistent/ca.crt: ")


HOSTILE_ARGS = json.dumps({"country": HOSTILE + "\x1b[2J\n"})


def test_query_passes_tools_and_schema_and_reports_the_call_the_model_made(capsys, monkeypatch) -> None:
    """A tool call is what the model answered, not "reasoning only"; rigctl runs nothing, and a
    hostile name or arguments stay data (JSON-quoted in the lines: no escape reaches a terminal)."""
    gw = Gateway()
    name = HOSTILE + "\n\x1b[31m"
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
    schema = {"type": "json_schema", "json_schema": {"name": "capital", "schema": {"type": "object"}}}
    _stdin(monkeypatch, {"prompt": "hi", "tools": tools, "response_format": schema})
    code, doc = rigctl_json(capsys, "query", "--request-stdin", "--url", gw.url)
    assert code == 0 and (gw.requests[-1]["tools"], gw.requests[-1]["response_format"]) == (tools, schema)
    assert doc["tool_calls"] == [{"id": "c1", "name": name, "arguments": HOSTILE_ARGS}]
    assert (doc["answer"], doc["reasoning_only"], doc["finish_reason"]) == ("", False, "tool_calls")
    assert doc["lines"][1] == f"tool call (not run): {json.dumps(name)} {json.dumps(HOSTILE_ARGS)}"
    assert not [c for line in doc["lines"] for c in line if ord(c) < 32]
    assert not Path("MARKER").exists()
    _stdin(monkeypatch, {"prompt": "hi"})
    code, doc = rigctl_json(capsys, "query", "--request-stdin", "--url", gw.url)
    assert "tools" not in gw.requests[-1] and "response_format" not in gw.requests[-1]
    assert doc["tool_calls"] == [] and doc["reasoning_only"] is True


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["query"], "one of the arguments prompt --request-stdin is required"),
        (
            ["query", "hi", "--request-stdin"],
            "argument --request-stdin: not allowed with argument prompt",
        ),
        (
            ["wait", "--no-chat", "--request-stdin"],
            "argument --request-stdin: not allowed with argument --no-chat",
        ),
    ],
)
def test_request_arguments_are_checked(capsys, argv, words) -> None:
    with pytest.raises(SystemExit) as ex:
        rigctl.main(argv)
    assert ex.value.code == rigctl.EXIT_USAGE and words in capsys.readouterr().err


@pytest.mark.parametrize(
    ("stdin", "words"),
    [
        ("not json", "--request-stdin: not one JSON object"),
        ('["hi"]', '--request-stdin: want {"prompt": TEXT, "max_tokens": N}'),
        ('{"prompt": "hi", "max_tokens": -1}', "--request-stdin: max_tokens must be 0 or more, got -1"),
        ('{"prompt": "hi", "tools": "get_capital"}', "--request-stdin: tools must be a list of objects"),
        ('{"prompt": "hi", "tools": [1]}', "--request-stdin: tools must be a list of objects"),
        ('{"prompt": "hi", "response_format": "json"}', "--request-stdin: response_format must be an object"),
    ],
)
def test_a_bad_request_on_stdin_is_a_usage_error(capsys, monkeypatch, stdin, words) -> None:
    monkeypatch.setattr(rigctl.sys, "stdin", io.StringIO(stdin))
    code, doc = rigctl_json(capsys, "query", "--request-stdin", "--url", "http://127.0.0.1:9")
    assert code == rigctl.EXIT_USAGE and doc["error"].startswith(words)


# This machine has no systemd to show the unit's IP filter (the e2e rig checks it).
NO_SYSTEMD = ("-e", "vllm_service_check_ip_filter=false")


def test_ready_and_smoke_run_rigctl_wait_with_the_prompt_on_stdin(tmp_path: Path) -> None:
    """smoke.yml's readiness check is rigctl's wait: the served name and timeouts as arguments,
    the smoke prompt (hostile here) as data on stdin; the answer it reports is shown and checked."""
    marker = tmp_path / "MARKER"
    hostile = HOSTILE.replace("MARKER", str(marker)) + "\x00"
    (tmp_path / "vars.yml").write_text(
        f"rig_smoke_prompt: !unsafe {json.dumps(hostile)}\nrig_smoke_expect: Paris\nrig_reach_hint: reach\n"
    )
    report = {"rigctl": rigctl.SCHEMA, "command": "wait", "ok": True, "build": "tiny",
              "chat": {"answer": "Paris"}, "lines": ["svc: serving tiny", "tiny: Paris"]}  # fmt: skip
    args = ("-e", f"@{tmp_path / 'vars.yml'}", *NO_SYSTEMD)
    run, argv = _play_with_fake_rigctl(tmp_path, "playbooks/smoke.yml", report, 0, *args)
    assert run.rc == 0, run.output[-3000:]
    assert argv == ["wait", "--json", "--model", "tiny", "--timeout", "900", "--chat-timeout", "300",
                    "--request-stdin"]  # fmt: skip
    assert json.loads((tmp_path / "stdin").read_text()) == {"prompt": hostile, "max_tokens": 512}
    assert "- 'tiny: Paris'" in run.output and """- 'answer: "Paris"'""" in run.output
    assert not marker.exists()


def test_ready_fails_with_rigctls_words(tmp_path: Path) -> None:
    words = (
        f"vLLM exited while starting (automatic restarts: 1, unit: activating); its last lines:\n{HOSTILE}"
    )
    report = {"rigctl": rigctl.SCHEMA, "command": "wait", "ok": False, "error": words, "exit": 1}
    run, _ = _play_with_fake_rigctl(tmp_path, "playbooks/smoke.yml", report, 1, *NO_SYSTEMD)
    assert run.rc != 0 and "Wait until vLLM answers, serving tiny" in run.output
    assert (
        "rigctl: vLLM exited while starting (automatic restarts: 1, unit: activating); its last lines:"
        in run.output
    )
