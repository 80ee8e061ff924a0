"""rigctl, the one place that works out a rig's state, on this machine: systemctl and journalctl
answered from a table, vLLM a FakeRig, the code checks real scripts in a helper folder; each
command's --json object against the schema in docs/mcp.md, hostile values the rig holds carried
byte for byte; then status.yml showing a rigctl report as data. The real rig runs them in
tests/e2e/test_30_rigctl_mcp.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
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
    assert rigctl.SETTINGS == {} and "vllm" not in source.replace("vLLM", "").replace("vllm_service", "")


def _play_with_fake_rigctl(tmp_path: Path, playbook: str, report: dict, code: int = 0, *args: str):
    """Run ``playbook`` on a rig whose rigctl prints ``report`` and exits ``code``; (the run, the
    argv rigctl got)."""
    (tmp_path / "report.json").write_text(json.dumps(report))
    fake = tmp_path / "rigctl"
    fake.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\ncat {tmp_path}/report.json\nexit {code}\n'
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
