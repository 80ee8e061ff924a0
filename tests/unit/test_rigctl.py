"""rigctl's pure parts: reading the unit's ExecStartPre lines, tpu.env, and its argument checks.
The commands themselves run on the e2e rig (tests/e2e/test_30_rigctl_mcp.py)."""

from __future__ import annotations

import importlib.util
import sys
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


def _rig_with_checks(tmp_path: Path, *argvs: list[str]):
    """A Rig whose unit runs ``argvs`` as ExecStartPre (systemctl show's way), read by rigctl."""
    lines = "".join(
        f"ExecStartPre={{ path={argv[0]} ; argv[]={' '.join(argv)} ; ignore_errors=no ; status=0/0 }}\n"
        for argv in argvs
    )
    rig = rigctl.Rig.__new__(rigctl.Rig)
    rig.unit, rig.props = "vllm", rigctl.parse_show(lines)
    return rig


def _check_script(tmp_path: Path, name: str, rc: int, words: str) -> list[str]:
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\necho '{words}'\nexit {rc}\n")
    script.chmod(0o755)
    return [str(script), "check", "--python", "/opt1/venv/bin/python"]


def test_code_checks_on_a_t4_or_local_unit(tmp_path: Path) -> None:
    rig = _rig_with_checks(
        tmp_path, _check_script(tmp_path, "clamp-check", 0, "clamp-check: turing clamp present once")
    )
    assert rigctl.code_check_lines(rig) == (["clamp: present once"], True)


def test_code_checks_on_a_tpu_unit(tmp_path: Path) -> None:
    """A TPU unit runs the tpu-inference patch check instead of the clamp: rigctl clamp and status
    report it, worded as status.yml words it."""
    ok = _rig_with_checks(tmp_path, _check_script(tmp_path, "tpu_inference_patch.py", 0, "patched"))
    assert rigctl.code_check_lines(ok) == (
        ["clamp: not used on this platform", "tpu-inference patch: present"],
        True,
    )
    # The real check, against a Python without tpu_inference: it fails and says why.
    real = [
        str(ROOT / "module_utils/tpu_inference_patch.py"),
        "check",
        "--python",
        sys.executable,
    ]
    lines, passed = rigctl.code_check_lines(_rig_with_checks(tmp_path, [sys.executable, "-I", *real]))
    assert not passed and lines[0] == "clamp: not used on this platform"
    assert lines[1].startswith("tpu-inference patch: MISSING: ") and len(lines[1]) > len(
        "tpu-inference patch: MISSING: "
    )


def test_a_unit_without_code_checks_fails(tmp_path: Path) -> None:
    lines, passed = rigctl.code_check_lines(_rig_with_checks(tmp_path))
    assert not passed and lines == [
        "clamp: MISSING: vllm.service runs no clamp or tpu-inference patch check before vLLM"
    ]
