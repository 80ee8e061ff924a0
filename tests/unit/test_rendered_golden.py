"""tpu.env and the vLLM unit, rendered for each platform profile, compared byte for byte with files.

One ansible-playbook run (local connection, nothing started) renders, with the project's own
inventory and roles, for:

- ``local``: host ``rig-local`` of inventory/local.yml (the default profile);
- ``gce``: host ``gemma-rig-1`` of inventory/gce.yml (the T4 profile);
- ``tpu``: host ``gemma-tpu-1`` of inventory/tpu.yml (the v5e profile: no clamp check, the
  tpu-inference patch check, the chip's device nodes, unlimited locked memory, a 30-minute start);
- ``gce-open``: the gce profile with the endpoint open, an API key and a model with its own
  vLLM args (google-w4a16), so the key, the listen address and the args' order are covered too;
- ``local-host-flags``: the local profile with one host's changes to its flags (one changed,
  one switch dropped, a JSON one and a new one added).

tpu.env comes from roles/rig_config (tasks ``render``, in memory) and the unit from
roles/vllm_service (tasks ``unit``), as the real plays do. The golden files are in
tests/golden/<case>/. After a deliberate change, regenerate them with

    GOLDEN_UPDATE=1 .venv/bin/pytest -q tests/unit/test_rendered_golden.py

and review ``git diff tests/golden`` (the diff is the change the rigs will see).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
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


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Render every case into one directory; return it."""
    out = tmp_path_factory.mktemp("rendered")
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
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return out


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("case", CASES)
def test_rendered_matches_golden(rendered: Path, case: str, name: str) -> None:
    got = (rendered / case / name).read_bytes()
    golden = GOLDEN / case / name
    if os.environ.get("GOLDEN_UPDATE"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(got)
    assert golden.exists(), f"{golden} is missing: run with GOLDEN_UPDATE=1 to create it"
    want = golden.read_bytes()
    diff = "".join(
        difflib.unified_diff(
            want.decode().splitlines(keepends=True),
            got.decode().splitlines(keepends=True),
            f"golden/{case}/{name}",
            f"rendered/{case}/{name}",
        )
    )
    assert got == want, f"rendered {case}/{name} differs from the golden file:\n{diff}"


def env_keys(text: str) -> list[str]:
    """The RIG_* keys of a tpu.env, in order."""
    return re.findall(r"(?m)^(RIG_[A-Z0-9_]+)=", text)


@pytest.mark.parametrize("case", CASES)
def test_unit_passes_exactly_the_flag_keys_of_tpu_env(rendered: Path, case: str) -> None:
    """rig_config and vllm_service each read the flags: the unit must pass every flag key, in order."""
    keys = env_keys((rendered / case / "tpu.env").read_text())
    unit = (rendered / case / "vllm.service").read_text()
    exec_start = unit[unit.index("ExecStart=") :].split("\nRestart=")[0]
    passed = re.findall(r"--([a-z0-9-]+) \$\{(RIG_[A-Z0-9_]+)\}", exec_start)
    # Each flag's key is its name in capitals; the role's own keys lead, RIG_EXTRA_ARGS ends.
    assert all(key == "RIG_" + flag.upper().replace("-", "_") for flag, key in passed), passed
    assert [key for _, key in passed] == [k for k in keys if k not in ("RIG_MODEL_KEY", "RIG_EXTRA_ARGS")]
    assert keys[-1] == "RIG_EXTRA_ARGS" and exec_start.rstrip().endswith("$RIG_EXTRA_ARGS")


def test_tpu_profile_settings(rendered: Path) -> None:
    """The v5e settings (docs/tpu.md) reach tpu.env and the unit: no T4 clamp, the patch checked."""
    env = (rendered / "tpu" / "tpu.env").read_text().splitlines()
    for line in (
        "RIG_MAX_MODEL_LEN=16384",
        "RIG_MAX_NUM_SEQS=16",
        "RIG_MAX_NUM_BATCHED_TOKENS=512",
        "RIG_GPU_MEMORY_UTILIZATION=0.8",
        'RIG_LIMIT_MM_PER_PROMPT="{\\"image\\":0,\\"audio\\":0,\\"video\\":0}"',
        "MIN_TOKEN_BUCKET=64",
        "VLLM_CACHE_ROOT=/opt1/cache/vllm",
        "VLLM_XLA_CACHE_PATH=/opt1/cache/vllm/xla_cache",
    ):
        assert line in env, f"{line!r} not in tpu.env: {env}"
    assert not any(k.startswith(("RIG_DTYPE=", "RIG_KV_CACHE_DTYPE=")) for k in env)
    unit = (rendered / "tpu" / "vllm.service").read_text()
    assert "clamp-check" not in unit and "swap-check" not in unit
    assert "tpu_inference_patch.py check --python /opt1/venv/bin/python" in unit
    assert "TimeoutStartSec=1800" in unit and "LimitMEMLOCK=infinity" in unit
    assert "DeviceAllow=char-vfio rw" in unit and "PrivateDevices=no" in unit
