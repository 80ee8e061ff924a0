"""The MCP server's real stack for the trust-boundary tests: an inventory of one rig that is a
FakeRig on this machine, and the server started as a client starts it (the SDK's stdio client)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
RIG = "rig-fake"


def installed_rigctl(directory: Path, port: int, key: str = "") -> Path:
    """rigctl as the vllm_service role installs it (its SETTINGS written in), in ``directory``,
    with a tpu.env naming a FakeRig's port (and VLLM_API_KEY); run by this Python."""
    directory.mkdir(parents=True, exist_ok=True)
    env = directory / "tpu.env"
    env.write_text(f"RIG_PORT={port}\n" + (f"VLLM_API_KEY={key}\n" if key else ""))
    source = (ROOT / "roles/vllm_service/files/rigctl.py").read_text()
    settings = {"unit": "vllm", "env_file": str(env), "helper_dir": str(directory), "python": sys.executable,
                "swap_state_dir": str(directory)}  # fmt: skip
    source = source.replace(
        "SETTINGS: dict[str, str] = {}", f"SETTINGS: dict[str, str] = {json.dumps(settings)}"
    )
    rigctl = directory / "rigctl"
    rigctl.write_text(f"#!{sys.executable} -I\n" + source.split("\n", 1)[1])
    rigctl.chmod(0o755)
    return rigctl


def fake_inventory(directory: Path, port: int, **hostvars: Any) -> Path:
    """An inventory of one rig, reached with a local connection at the FakeRig's 127.0.0.1:port
    through an installed rigctl. It lives outside the repository, so the repository's group_vars
    do not apply: query.yml's inputs (rig_ctl, rig_smoke_prompt) are set here."""
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "rig_ctl": str(installed_rigctl(directory / "rig", port)),
        "rig_platform": "local",
        "rig_listen_address": "127.0.0.1",
        "rig_port": port,
        "rig_api_headers": {},
        "rig_smoke_prompt": "What is the capital of France?",
        "rig_model": "tiny-emb4",
        "rig_models": {"tiny-emb4": {"description": "d", "source": {"kind": "repack"}, "size_bytes": 20}},
        **hostvars,
    }
    path = directory / "fake-rig.yml"
    path.write_text(yaml.safe_dump({"rigs": {"children": {"local": {"hosts": {RIG: host}}}}}))
    return path


def isolated_env(tmp_path: Path) -> dict[str, str]:
    """A server environment whose temporary files and home are inside ``tmp_path`` (so a test can
    search all of them), and nothing else of this process's."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    return {
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }


def stdio(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> StdioServerParameters:
    """``python -m rig_mcp ARGS`` with exactly ``env``, and PYTHONPATH led by this checkout: the
    SDK adds its own default variables to a server's environment, so the command goes through
    ``env -i``. From a ``cwd`` outside the checkout, ``rig_mcp`` would otherwise come from the
    virtualenv's editable install, which in a second worktree sharing it is the other tree."""
    path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    pairs = [f"{k}={v}" for k, v in {**env, "PYTHONPATH": path}.items()]
    return StdioServerParameters(
        command="/usr/bin/env", args=["-i", *pairs, str(VENV_PYTHON), "-m", "rig_mcp", *args], cwd=str(cwd)
    )


async def call_tools(params: StdioServerParameters, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Each (tool, arguments) in turn over one session; the CallToolResults."""
    async with Client(params) as client:
        return [await client.call_tool(name, arguments) for name, arguments in calls]
