"""Render tpu.env and the vLLM unit for each golden case, as the real plays do.

One ansible-playbook run (local connection, nothing started) renders, with the project's own
inventory and roles, every case of ``CASES`` into a directory of the caller's. The golden test
(tests/unit/test_rendered_golden.py) compares what it renders with the files beside this module;
only ``tests/golden/update.py``, run by hand, writes those.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from tests.conftest import ROOT, VENV_BIN

GOLDEN = ROOT / "tests" / "golden"
FILES = ("tpu.env", "vllm.service")
# Host variables of the extra case; a test-only key, never a real one.
OPEN_VARS = {
    "rig_model": "google-w4a16",
    "rig_endpoint_open": True,
    "rig_endpoint_source_ranges": ["203.0.113.0/24"],
    "rig_api_key": "sk-golden-0123456789abcdef",
}
HOST_FLAGS_VARS = {
    "rig_vllm_host_flags": {
        "max-num-seqs": 2,
        "enforce-eager": None,
        "speculative-config": {"method": "ngram", "num_speculative_tokens": 4},
        "seed": 7,
        "enable-prefix-caching": True,
    }
}
CASES = {
    "local": "rig-local",
    "gce": "gemma-rig-1",
    "tpu": "gemma-tpu-1",
    "gce-open": "golden-gce-open",
    "local-host-flags": "golden-local-host-flags",
}


class RenderFailed(AssertionError):
    """ansible-playbook failed to render the cases; the message is its output's tail."""


def render(out: Path) -> None:
    """Render every case into ``out/<case>/`` (an existing directory) with one ansible-playbook run."""
    extra = out / "hosts.yml"
    extra.write_text(
        yaml.safe_dump(
            {
                "rigs": {
                    "children": {
                        "gce": {"hosts": {CASES["gce-open"]: OPEN_VARS}},
                        "local": {"hosts": {CASES["local-host-flags"]: HOST_FLAGS_VARS}},
                    }
                }
            }
        )
    )
    case_of = {host: case for case, host in CASES.items()}
    play = [
        {
            "hosts": ",".join(CASES.values()),
            "gather_facts": False,
            "vars": {"golden_dir": f"{out}/{{{{ {json.dumps(case_of)}[inventory_hostname] }}}}"},
            "tasks": [
                {
                    "name": "Create the case directory",
                    "ansible.builtin.file": {
                        "path": "{{ golden_dir }}",
                        "state": "directory",
                        "mode": "0755",
                    },
                },
                {
                    # validate looks the model up in the catalog; render reads what it found.
                    "name": "Check the variables",
                    "ansible.builtin.include_role": {"name": "rig_config", "tasks_from": "validate"},
                },
                {
                    "name": "Render tpu.env",
                    "ansible.builtin.include_role": {"name": "rig_config", "tasks_from": "render"},
                },
                {
                    "name": "Write tpu.env",
                    "ansible.builtin.copy": {
                        "content": "{{ _rig_config_rendered }}",
                        "dest": "{{ golden_dir }}/tpu.env",
                        "mode": "0644",
                    },
                },
                {
                    "name": "Render the unit",
                    "ansible.builtin.include_role": {"name": "vllm_service", "tasks_from": "unit"},
                    "vars": {"_vllm_service_unit_path": "{{ golden_dir }}/vllm.service"},
                },
            ],
        }
    ]
    playbook = out / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    evars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(VENV_BIN / "python"),
        "vllm_service_start": False,  # nothing is started; the handler restarts nothing
    }
    cmd = [str(VENV_BIN / "ansible-playbook")]
    for inventory in (*(ROOT / "inventory" / f"{name}.yml" for name in ("local", "gce", "tpu")), extra):
        cmd += ["-i", str(inventory)]
    cmd += ["-e", json.dumps(evars), str(playbook)]
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RenderFailed((res.stdout + res.stderr)[-4000:])
