"""The shared local rig as docs/rig-contract.md describes it: tpu.env's owner, mode and keys, the
user vLLM runs as, and the unit's hardening score; and the endpoint an agent gets (docs/agents.md):
tool calls, a tool's result answered, a streamed call, a JSON schema, reasoning apart, with the
openai SDK and through rigctl query.

These checks lived in the molecule scenario `local`, which stood up a second, identical rig only
to make them; the e2e rig that site.yml stands up is the same Debian 12 container with the same
roles, so they run on it instead (the clamp refusal: test_90_swap_crash's start-limit test, and molecule `gce`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import subprocess
import sys

import openai
import pytest
import yaml

from repack import tiny_facts
from tests.conftest import ROOT
from tests.e2e.agents import assert_agent_endpoint
from tests.e2e.rig import podman

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start

ENV_FILE = "/etc/gemma-rig/tpu.env"
MAX_EXPOSURE = 3.0  # systemd-analyze security's scale: 0 (locked down) to 10 (exposed)


def rig_exec(container: str, *cmd: str) -> str:
    result = podman("exec", container, *cmd)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_tpu_env_is_root_owned_and_readable_by_the_service_only(local_rig) -> None:
    stat = rig_exec(local_rig.container, "stat", "-c", "%a %U %G", ENV_FILE).split()
    assert stat == ["640", "root", "vllm"]


def test_tpu_env_holds_the_contract_keys(local_rig) -> None:
    lines = rig_exec(local_rig.container, "cat", ENV_FILE).splitlines()
    for wanted in (
        "RIG_MODEL=/opt1/models/current",
        f"RIG_SERVED_MODEL_NAME={local_rig.model}",
        f"RIG_MODEL_KEY={local_rig.model}",
        f"RIG_PORT={local_rig.port}",
        "RIG_HOST=127.0.0.1",
    ):
        assert wanted in lines, (wanted, lines)
    assert len([line for line in lines if re.match(r"^RIG_EXTRA_ARGS=.*--enforce-eager", line)]) == 1


def test_no_maintenance_timer_races_the_roles_apt(local_rig) -> None:
    """The local image masks the timers that update packages or maintain the disk: on a new
    container their Persistent= schedule fires at once, beside the roles' own apt."""
    timers = [
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "dpkg-db-backup.timer",
        "e2scrub_all.timer",
        "fstrim.timer",
    ]
    states = podman("exec", local_rig.container, "systemctl", "is-enabled", *timers).stdout.split()
    assert states == ["masked"] * len(timers), list(zip(timers, states, strict=False))


def test_vllm_runs_as_its_own_user(local_rig) -> None:
    pid = rig_exec(local_rig.container, "systemctl", "show", "-p", "MainPID", "--value", "vllm").strip()
    assert pid not in ("", "0"), "vllm.service has no main process"
    assert rig_exec(local_rig.container, "ps", "-o", "user=", "-p", pid).strip() == "vllm"


PLUGINS = yaml.safe_load((ROOT / "inventory" / "group_vars" / "local.yml").read_text())["vllm_plugins"]


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p["name"] for p in PLUGINS])
def test_the_plugin_on_the_rig_is_the_source_tree(local_rig, plugin: dict) -> None:
    """The digest recorded beside the plugin's copy is the source tree's, computed by the role's own code
    (a digest of nothing once matched every tree, so a changed plugin was never sent)."""
    code = yaml.safe_load((ROOT / "roles/vllm/vars/main.yml").read_text())["_vllm_tree_digest_code"]
    source = ROOT / "roles/vllm/files" / plugin["src"]
    digest = subprocess.run(
        [sys.executable, "-I", "-c", code, str(source), ".egg-info", "__pycache__"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert digest != hashlib.sha256().hexdigest()
    recorded = rig_exec(local_rig.container, "cat", f"/opt1/plugins/{plugin['name']}.sha256").strip()
    assert recorded == digest
    listed = rig_exec(local_rig.container, "find", f"/opt1/plugins/{plugin['name']}", "-name", "__init__.py")
    assert f"/opt1/plugins/{plugin['name']}/{plugin['src']}/__init__.py" in listed.split()


def test_vllm_runs_the_model_in_the_engine_process(local_rig) -> None:
    """The local profile's uni executor: vLLM's processes are the API server and its engine only."""
    names = rig_exec(local_rig.container, "ps", "-u", "vllm", "-o", "args=").splitlines()
    assert any(name.startswith("VLLM::EngineCore") for name in names), names
    assert not any("Worker" in name for name in names), names


def test_the_engine_process_is_a_fork_of_the_server(local_rig) -> None:
    """tpu.env's GEMMA_RIG_ENGINE_START=fork reaches the plugin: the engine process shares the
    server's auxiliary vector (no exec of its own, so no second import of torch and vLLM), and no
    spawn resource tracker runs beside it."""
    pid = rig_exec(local_rig.container, "systemctl", "show", "-p", "MainPID", "--value", "vllm").strip()
    # As the service's user: root in the container lacks CAP_SYS_PTRACE, which reading another
    # user's auxv needs. cmp says 0 (same), 1 (differs) or 2 (could not read: a failure here).
    script = (
        f"c=$(cat /proc/{pid}/task/{pid}/children); set -- $c; [ $# -eq 1 ] || {{ echo children: $c; exit 0; }}; "
        f'echo "$(cat /proc/$1/comm)"; runuser -u vllm -- cmp -s /proc/$1/auxv /proc/{pid}/auxv; '
        "case $? in 0) echo forked;; 1) echo spawned;; *) echo unreadable;; esac"
    )
    assert rig_exec(local_rig.container, "sh", "-c", script).split() == ["VLLM::EngineCor", "forked"]


def test_vllm_gets_the_local_profiles_flags_in_order(local_rig) -> None:
    """Every flag of the local profile reaches vLLM's argv (tpu.env -> unit), valued ones in order."""
    flags = yaml.safe_load((ROOT / "inventory" / "group_vars" / "local.yml").read_text())["rig_vllm_flags"]
    pid = rig_exec(local_rig.container, "systemctl", "show", "-p", "MainPID", "--value", "vllm").strip()
    argv = rig_exec(local_rig.container, "cat", f"/proc/{pid}/cmdline").split("\0")
    valued = [(f"--{k}", str(v)) for k, v in flags.items() if v is not True]
    pairs = list(itertools.pairwise(argv))
    at = [pairs.index(pair) for pair in valued if pair in pairs]
    assert len(at) == len(valued) and at == sorted(at), (valued, argv)
    for switch in (f"--{k}" for k, v in flags.items() if v is True):
        assert switch in argv, (switch, argv)


def test_the_unit_is_hardened(local_rig, figure) -> None:
    report = rig_exec(local_rig.container, "systemd-analyze", "security", "--no-pager", "vllm.service")
    found = re.search(r"Overall exposure level for vllm.service: ([0-9.]+)", report)
    assert found, report[-2000:]
    figure("systemd-analyze security, vllm.service exposure", found[1])
    assert float(found[1]) <= MAX_EXPOSURE, report[-3000:]


def test_an_agent_gets_tool_calls_schemas_and_reasoning_apart(local_rig) -> None:
    """The flags of the one table (rig_vllm_feature_flags) reach vLLM for the build that carries
    them, and an agent with the openai SDK gets what they promise from the rig itself."""
    table = yaml.safe_load((ROOT / "inventory/group_vars/all/vllm.yml").read_text())["rig_vllm_feature_flags"]
    pid = rig_exec(local_rig.container, "systemctl", "show", "-p", "MainPID", "--value", "vllm").strip()
    argv = rig_exec(local_rig.container, "cat", f"/proc/{pid}/cmdline").split("\0")
    for flags in table.values():
        for flag, value in flags.items():
            assert f"--{flag}" in argv and (value is True or argv[argv.index(f"--{flag}") + 1] == value), argv
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{local_rig.port}/v1", api_key="none", max_retries=0)
    assert_agent_endpoint(client, local_rig.model)


def test_rigctl_query_reports_the_tool_call_it_did_not_run(local_rig) -> None:
    """rigctl on the rig passes tools from its stdin request and reports the call, not an empty answer."""
    country, _ = tiny_facts.TOOL_ASKS[0]
    request = json.dumps(
        {"prompt": tiny_facts.tool_question(country), "max_tokens": 64, "tools": tiny_facts.TOOLS}
    )
    done = subprocess.run(
        ["podman", "exec", "-i", local_rig.container, "rigctl", "query", "--json", "--request-stdin"],
        input=request, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["answer"], doc["reasoning_only"], doc["finish_reason"]) == ("", False, "tool_calls"), doc
    [call] = doc["tool_calls"]
    assert call["name"] == tiny_facts.TOOL_NAME and json.loads(call["arguments"]) == {"country": country}


def test_the_docs_agent_example_runs_as_written(local_rig) -> None:
    """docs/agents.md's openai SDK example, run unchanged against the rig, gets the tool's answer."""
    page = (ROOT / "docs" / "agents.md").read_text()
    [example] = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert f"127.0.0.1:{local_rig.port}/v1" in example, "the example names the local rig's address"
    done = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Canberra" in done.stdout, done.stdout
