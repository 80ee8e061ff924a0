"""Run roles/checkpoint alone through real ansible-playbook on this machine; read its JSON result.

Shared by the push and pull tests: a one-role play whose "restart vllm" handler is a stand-in the
test chooses, run against localhost with the local inventory's variables.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT, VENV_BIN


def write_play(path: Path, handler: dict[str, Any]) -> Path:
    """A play running the checkpoint role with ``handler`` listening to "restart vllm"."""
    play = {"hosts": "localhost", "gather_facts": False, "roles": ["checkpoint"]}
    play["handlers"] = [{**handler, "listen": "restart vllm"}]
    path.write_text(yaml.safe_dump([play]))
    return path


def run_play(
    play: Path, evars: dict[str, Any], *args: str, env: dict[str, str] | None = None
) -> tuple[int, list[dict[str, Any]], str]:
    """Run ``play``; returns rc, each task's localhost result in order, and the whole output."""
    evars = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python"), **evars}
    full_env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
        **(env or {}),
    }
    cmd = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        str(ROOT / "inventory" / "local.yml"),
        "-i",
        "localhost,",
    ]
    cmd += ["-e", json.dumps(evars), *args, str(play)]
    res = subprocess.run(
        cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, check=False, timeout=600
    )
    tasks = [t["hosts"].get("localhost", {}) for p in json.loads(res.stdout)["plays"] for t in p["tasks"]]
    return res.returncode, tasks, res.stdout + res.stderr
