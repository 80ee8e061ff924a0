"""rigctl's pure parts: reading the unit's ExecStartPre lines, tpu.env, and its argument checks.
The commands themselves run on the e2e rig (tests/e2e/test_30_rigctl_mcp.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("rigctl", ROOT / "roles/vllm_service/files/rigctl.py")
rigctl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rigctl)

# systemd 252's `systemctl show vllm`, as the e2e rig prints it: one ExecStartPre= line per command.
SHOW = """\
ExecStartPre={ path=/usr/bin/python3 ; argv[]=/usr/bin/python3 -I /usr/local/libexec/gemma-rig/swap-journal \
--state-dir /var/lib/gemma-rig --env-file /etc/gemma-rig/tpu.env --current /opt1/models/current --unit vllm guard ; \
ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }
ExecStartPre={ path=/opt1/venv/bin/python ; argv[]=/opt1/venv/bin/python -I /usr/local/libexec/gemma-rig/clamp-check \
check --python /opt1/venv/bin/python ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; \
code=(null) ; status=0/0 }
EnvironmentFiles=/etc/gemma-rig/tpu.env (ignore_errors=no)
"""


def test_exec_start_pre_lines_are_read_as_argvs() -> None:
    argvs = rigctl.exec_argvs(rigctl.parse_show(SHOW)["ExecStartPre"])
    assert argvs[1] == [
        "/opt1/venv/bin/python",
        "-I",
        "/usr/local/libexec/gemma-rig/clamp-check",
        "check",
        "--python",
        "/opt1/venv/bin/python",
    ]
    assert argvs[0][argvs[0].index("--state-dir") + 1] == "/var/lib/gemma-rig"


def test_env_file_comes_from_the_unit() -> None:
    assert rigctl.env_file_path({"EnvironmentFiles": "/etc/x/tpu.env (ignore_errors=no)"}) == "/etc/x/tpu.env"
    assert rigctl.env_file_path({}) == rigctl.DEFAULT_ENV_FILE


def test_tpu_env_is_read_as_systemd_reads_it(tmp_path: Path) -> None:
    env = tmp_path / "tpu.env"
    env.write_text('# c\nRIG_PORT=8000\nRIG_EXTRA_ARGS="--a \\"b\\" c"\n\nVLLM_API_KEY=k\n')
    assert rigctl.read_env(str(env)) == {
        "RIG_PORT": "8000",
        "RIG_EXTRA_ARGS": '--a "b" c',
        "VLLM_API_KEY": "k",
    }
    with pytest.raises(rigctl.RigctlError) as missing:
        rigctl.read_env(str(tmp_path / "none"))
    assert missing.value.code == rigctl.EXIT_NO_CONFIG


def test_bad_arguments_exit_2_with_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        rigctl.main(["logs", "-n", "-1"])
    assert ex.value.code == rigctl.EXIT_USAGE
    assert "must be 0 or more, got -1" in capsys.readouterr().err
