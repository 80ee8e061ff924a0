"""Secrets never show: the tasks that handle the HF token, the API key and tokens in vLLM's
environment run at -vvv (and --diff) with known secrets, by real ansible-playbook on this machine,
while a thread samples every process's command line. No secret may appear in the output or in any
command line; the secret must still have done its job (the hub got the token, tpu.env holds it).

The hub is tests/unit/fake_hub.py, a local stand-in that real huggingface_hub talks to (HF_ENDPOINT).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN
from tests.secret_watch import CmdlineSampler
from tests.unit.fake_hub import FakeHub

pytestmark = pytest.mark.slow  # ansible-playbook runs

HF_TOKEN = "hf_Zq8secretTOKENfortests0042"
API_KEY = "sk-rig-secretKEYfortests-0042"
ENV_TOKEN = "ghp_secretENVtokenfortests0042"
ENV_PASSWORD = "pw-secretPASSWORDfortests0042"
SECRETS = [HF_TOKEN, API_KEY, ENV_TOKEN, ENV_PASSWORD]
REPO = "google/gemma-4-E2B-it-qat-w4a16-ct"  # the catalog's google-w4a16 entry


def play_file(tmp_path: Path, tasks: list[dict[str, Any]], roles: list[str] | None = None) -> Path:
    """A play on host rig-test (group local) whose "restart vllm" handler only records itself."""
    play: dict[str, Any] = {"hosts": "rig-test", "gather_facts": False}
    if roles:
        play["roles"] = roles
    if tasks:
        play["tasks"] = tasks
    play["handlers"] = [
        {
            "name": "Record the restart",
            "ansible.builtin.file": {"path": str(tmp_path / "restarted"), "state": "touch"},
            "listen": "restart vllm",
        }
    ]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([play]))
    return path


def run(tmp_path: Path, play: Path, evars: dict[str, Any], *args: str) -> tuple[int, str, CmdlineSampler]:
    """ansible-playbook -vvv with ``evars`` from a 0600 file (not on its own command line)."""
    hosts = tmp_path / "hosts.yml"
    hosts.write_text(yaml.safe_dump({"rigs": {"children": {"local": {"hosts": {"rig-test": {}}}}}}))
    vars_file = tmp_path / "secret-vars.json"
    vars_file.touch(mode=0o600)
    vars_file.write_text(
        json.dumps(
            {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python"), **evars}
        )
    )
    cmd = [str(VENV_BIN / "ansible-playbook"), "-vvv", "-i", str(ROOT / "inventory" / "local.yml")]
    cmd += ["-i", str(hosts), "-e", f"@{vars_file}", *args, str(play)]
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    with CmdlineSampler(SECRETS) as sampler:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=600)
    return res.returncode, res.stdout + res.stderr, sampler


def decoded_base64(out: str) -> str:
    """Every base64 run in ``out``, decoded (slurp returns file contents that way)."""
    found = []
    for run_ in re.findall(r"[A-Za-z0-9+/]{16,}={0,2}", out):
        try:
            found.append(base64.b64decode(run_ + "=" * (-len(run_) % 4)).decode(errors="replace"))
        except ValueError:
            continue
    return "\n".join(found)


def assert_never_shown(out: str, sampler: CmdlineSampler) -> None:
    hidden = decoded_base64(out)
    for secret in SECRETS:
        assert secret not in out, (
            f"a secret shows in the output: ...{out[max(0, out.find(secret) - 300) :][:600]}"
        )
        assert secret not in hidden, "a secret shows base64-encoded in the output"
    assert sampler.hits == [], sampler.hits
    assert sampler.rounds > 10 and sampler.saw("ansible-playbook")


def pull_vars(tmp_path: Path, hub: FakeHub, token: str) -> dict[str, Any]:
    return {
        "rig_model": "google-w4a16",
        "checkpoint_models_dir": str(tmp_path / "models"),
        "checkpoint_current_link": str(tmp_path / "models" / "current"),
        "checkpoint_group": "root",
        "checkpoint_hub_python": str(VENV_BIN / "python"),  # real huggingface_hub
        "checkpoint_hub_endpoint": hub.endpoint,
        "checkpoint_hub_token": token,
    }


def test_hf_pull_passes_the_token_without_showing_it(tmp_path: Path) -> None:
    files = {"config.json": b'{"model_type": "gemma4"}', "model.safetensors": b"w" * 4096}
    play = play_file(tmp_path, [], roles=["checkpoint"])
    with FakeHub(REPO, HF_TOKEN, files) as hub:
        rc, out, sampler = run(tmp_path, play, pull_vars(tmp_path, hub, HF_TOKEN), "--diff")
        assert rc == 0, out[-4000:]
        downloads = [r for r in hub.log if "/resolve/" in r["path"] and r["method"] == "GET"]
    # The token did its job: every download carried it, and the snapshot is what `current` serves.
    assert len(downloads) == 2 and all(r["authorization"] == f"Bearer {HF_TOKEN}" for r in downloads)
    current = tmp_path / "models" / "current"
    assert (current / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert_never_shown(out, sampler)
    assert sampler.saw("hub_pull.py --repo " + REPO)  # the helper ran while the sampler looked


def test_hf_pull_with_a_refused_token_fails_without_showing_it(tmp_path: Path) -> None:
    play = play_file(tmp_path, [], roles=["checkpoint"])
    with FakeHub(REPO, "hf_the_right_one_is_another", {"config.json": b"{}"}) as hub:
        rc, out, sampler = run(tmp_path, play, pull_vars(tmp_path, hub, HF_TOKEN))
        assert any(r["authorization"] == f"Bearer {HF_TOKEN}" for r in hub.log)
    assert rc != 0
    assert f"pulling {REPO} failed" in out
    assert_never_shown(out, sampler)
    assert not (tmp_path / "models" / "current").exists()


@pytest.mark.parametrize("api_key", [API_KEY, ""], ids=["with-api-key", "tokens-only"])
def test_tpu_env_secrets_stay_out_of_output_and_diff(tmp_path: Path, api_key: str) -> None:
    env_file = tmp_path / "etc" / "tpu.env"
    environment = {"HF_HOME": "/opt1/cache/huggingface", "HF_TOKEN": ENV_TOKEN, "DB_PASSWORD": ENV_PASSWORD}
    base = {
        "rig_config_env_file": str(env_file),
        "rig_config_group": "root",
        "rig_api_key": api_key,
        "rig_vllm_environment": environment,
    }
    play = play_file(tmp_path, [], roles=["rig_config"])
    rc, out, sampler = run(tmp_path, play, base, "--diff")
    assert rc == 0, out[-4000:]
    assert_never_shown(out, sampler)
    text = env_file.read_text()
    assert f"HF_TOKEN={ENV_TOKEN}" in text and f"DB_PASSWORD={ENV_PASSWORD}" in text
    assert (f"VLLM_API_KEY={API_KEY}" in text) == bool(api_key)

    # A change: --diff says which keys changed, by name only, and the copy to tpu.env.prev shows nothing.
    rc, out, sampler = run(tmp_path, play, {**base, "rig_vllm_host_flags": {"max-num-seqs": 3}}, "--diff")
    assert rc == 0, out[-4000:]
    assert_never_shown(out, sampler)
    assert "tpu.env: RIG_MAX_NUM_SEQS changed" in out
    assert "DB_PASSWORD" in out  # named among the secrets, its value hidden
    assert (tmp_path / "etc" / "tpu.env.prev").read_text() == text


def test_swap_reads_tpu_env_without_showing_it(tmp_path: Path) -> None:
    env_file = tmp_path / "tpu.env"
    env_file.write_text(f"RIG_MODEL_KEY=tiny-emb4\nVLLM_API_KEY={API_KEY}\nHF_TOKEN={ENV_TOKEN}\n")
    (tmp_path / "current").symlink_to(tmp_path)
    tasks = [
        {"name": "Read the swap state", "ansible.builtin.include_role": {"name": "swap", "tasks_from": "read_state"}},
        {"name": "Show the old model", "ansible.builtin.debug": {"msg": "old model: {{ _swap_old_model }}"}},
    ]  # fmt: skip
    play = play_file(tmp_path, tasks)
    evars = {"rig_env_file": str(env_file), "rig_current_model_link": str(tmp_path / "current")}
    rc, out, sampler = run(tmp_path, play, evars)
    assert rc == 0, out[-4000:]
    assert "old model: tiny-emb4" in out
    assert_never_shown(out, sampler)
