"""A prompt is data: hostile prompts through the real stack (the SDK's stdio client -> python -m
rig_mcp -> ansible-runner -> playbooks/query.yml -> a FakeRig) reach the model byte for byte, and
nothing in them is templated by Ansible or run by a shell on the controller."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from rig_mcp.playbooks import PlaybookRunner
from tests.fake_rig import FakeRig
from tests.unit.mcp_stack import RIG, call_tools, fake_inventory, isolated_env, stdio


def hostile(marker: Path) -> str:
    """One prompt holding every class of hostile input; each command in it would create
    ``marker``-N on the controller. (A playbook run costs seconds: one prompt, not one per class.)"""
    return (
        # Jinja: an expression, lookups that run a command, a statement, a comment, a raw block.
        f"{{{{ 7*6 }}}} {{{{ lookup('pipe', 'touch {marker}-1') }}}} {{{{ query('pipe', 'touch {marker}-2') }}}}"
        f" {{% set x = lookup('pipe', 'touch {marker}-3') %}}{{{{ x }}}} {{# hidden #}} {{% raw %}}r{{% endraw %}}"
        # Shell: substitution, sequencing, backticks, pipes, redirection; quotes of both kinds.
        f" $(touch {marker}-4) ; touch {marker}-5 && `touch {marker}-6` | tee {marker}-7 > {marker}-8"
        " 'single' \"double\" \\ backslash\n"
        # YAML: a document marker, tags, anchors and aliases, a flow mapping; newlines and tabs.
        "--- !!python/object/apply:os.system ['touch pwned-9']\n&a x *a\n{a: b}\t# not a comment\n...\n"
        # Non-ASCII, emoji, a right-to-left override, and NUL, which JSON carries to the model.
        "Capitale de la France ? 東京 \u202eevil\u202c 🙂👩‍🚀 nul:\x00:end"
    )


# Each case is a server start and a playbook run per prompt: the read-write one (and its 100 KB
# prompt) takes over 20 s on a busy controller, so it runs in the slow lane.
@pytest.mark.parametrize(
    "read_only", [pytest.param(False, marks=pytest.mark.slow), True], ids=["read-write", "read-only"]
)
def test_hostile_prompts_reach_the_model_unchanged_and_run_nothing(tmp_path: Path, read_only: bool) -> None:
    marker = tmp_path / "pwned"
    one = hostile(marker)
    prompts = [one]
    if not read_only:  # and over 100 KB of it, once
        prompts.append((one + "é") * (100_000 // (len(one) + 1) + 1))
    with FakeRig("tiny-emb4") as rig:
        inventory = fake_inventory(tmp_path, rig.port)
        args = ["-i", str(inventory), "--lock-dir", str(tmp_path / "locks")]
        if read_only:
            args.append("--read-only")
        # The server's working directory is tmp_path: pwned-9 would land there.
        params = stdio(args, isolated_env(tmp_path), cwd=tmp_path)
        results = anyio.run(
            call_tools, params, [("query", {"prompt": p, "rig": RIG, "max_tokens": 8}) for p in prompts]
        )
    for result in results:
        assert not result.is_error, result.content[0].text
        assert result.structured_content["answer"] == "Paris"
    received = [entry["messages"] for entry in rig.log if entry["path"] == "/v1/chat/completions"]
    assert received == [[{"role": "user", "content": p}] for p in prompts]
    assert read_only or len(prompts[-1]) > 100_000
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pwned")) == []


def test_the_runner_hands_every_extra_var_to_ansible_as_data(tmp_path: Path) -> None:
    """The runner itself, whatever a playbook does with its variables: real ansible-runner and
    ansible-playbook on a playbook that uses each variable as a plain template, as most do."""
    marker = tmp_path / "pwned"
    (tmp_path / "echo.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Echo\n      ansible.builtin.debug:\n"
        "        msg: \"{{ {'prompt': prompt, 'nested': nested} }}\"\n"
    )
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    values = {"prompt": hostile(marker), "nested": {"{{ 7*6 }}": ["{{ 7*6 }}", 3]}}
    run = PlaybookRunner([str(inventory)], root=tmp_path).run("echo.yml", extravars=values)
    assert run.failure is None, run.failure
    assert run.result("Echo")["msg"] == values
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pwned")) == []


def test_hostile_tools_and_schema_reach_the_model_unchanged_and_run_nothing(tmp_path: Path) -> None:
    """A tool's name, description and parameters and a response_format are data on the whole way
    (MCP -> ansible-runner -> query.yml -> rigctl's stdin): the rig's chat gets them as sent."""
    marker = tmp_path / "pwned"
    text = hostile(marker)
    tools = [
        {
            "type": "function",
            "function": {
                "name": text[:64],
                "description": text,
                "parameters": {"type": "object", "properties": {text: {"type": "string"}}},
            },
        }
    ]
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "description": text}},
    }
    with FakeRig("tiny-emb4") as rig:
        inventory = fake_inventory(tmp_path, rig.port)
        params = stdio(["-i", str(inventory), "--lock-dir", str(tmp_path / "locks"), "--read-only"],
                       isolated_env(tmp_path), cwd=tmp_path)  # fmt: skip
        args = {"prompt": "hi", "rig": RIG, "max_tokens": 8, "tools": tools, "response_format": schema}
        [result] = anyio.run(call_tools, params, [("query", args)])
    assert not result.is_error, result.content[0].text
    [chat] = [entry for entry in rig.log if entry["path"] == "/v1/chat/completions"]
    assert (chat["tools"], chat["response_format"]) == (tools, schema)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pwned")) == []
