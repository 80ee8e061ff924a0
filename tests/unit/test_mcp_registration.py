"""The registration docs/mcp.md gives a client works as written: each JSON snippet's command line,
run with exactly the snippet's environment (no PATH), answers every tool that needs no live rig;
and a broken environment reaches the client as one line naming the cause and the fix."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from rig_mcp.server import Config, build
from tests.fake_rig import FakeRig
from tests.unit.mcp_stack import RIG, ROOT, call_tools, fake_inventory

DOC = ROOT / "docs" / "mcp.md"
PLACEHOLDER = "/path/to/gemma-rig"


def snippets() -> list[dict[str, Any]]:
    """Every server entry with a command in docs/mcp.md's JSON blocks, the repository root in
    place of the placeholder."""
    found = []
    for block in re.findall(r"```json\n(.*?)```", DOC.read_text(), re.S):
        doc = json.loads(block.replace(PLACEHOLDER, str(ROOT)))
        for servers in (doc.get("mcpServers"), doc.get("servers")):
            found += [entry for entry in (servers or {}).values() if "command" in entry]
    return found


def launch(entry: dict[str, Any], cwd: Path, args: list[str] | None = None) -> StdioServerParameters:
    """The snippet as a client runs it, through ``env -i`` so the environment is the snippet's
    alone (the SDK's stdio client would add PATH, HOME and others)."""
    pairs = [f"{k}={v}" for k, v in entry.get("env", {}).items()]
    return StdioServerParameters(
        command="/usr/bin/env",
        args=["-i", *pairs, entry["command"], *(entry.get("args", []) if args is None else args)],
        cwd=str(cwd),
    )


def test_docs_hold_a_stdio_snippet_with_absolute_paths() -> None:
    entries = snippets()
    assert entries, "docs/mcp.md has no JSON snippet with a command"
    for entry in entries:
        assert Path(entry["command"]).is_absolute() and Path(entry["command"]).exists(), entry
        assert "PATH" not in entry.get("env", {}), "the snippet must work without PATH"


def test_each_documented_snippet_answers_every_tool_without_path(tmp_path: Path) -> None:
    for entry in snippets():
        list_rigs, list_models = anyio.run(
            call_tools, launch(entry, tmp_path), [("list_rigs", {}), ("list_models", {})]
        )
        assert not list_rigs.is_error, list_rigs.content[0].text
        assert not list_models.is_error, list_models.content[0].text
        assert [r["rig"] for r in list_rigs.structured_content["result"]] == ["rig-local"]
        assert list_models.structured_content["result"], "the catalog is empty"


def test_a_snippet_runs_playbooks_without_path(tmp_path: Path) -> None:
    """The same command line against a FakeRig's inventory: query runs ansible-playbook."""
    entry = snippets()[0]
    args = list(entry["args"])
    with FakeRig("tiny-emb4") as rig:
        args[args.index("-i") + 1] = str(fake_inventory(tmp_path, rig.port))
        (result,) = anyio.run(
            call_tools,
            launch(entry, tmp_path, [*args, "--read-only"]),
            [("query", {"prompt": "hi", "rig": RIG})],
        )
    assert not result.is_error, result.content[0].text
    assert result.structured_content["answer"] == "Paris"


def test_ansible_missing_from_the_virtualenv_is_one_line_with_the_fix(tmp_path: Path) -> None:
    """A python whose bin directory (and scripts directory) holds no Ansible: one line naming the
    missing command, where it looked, and scripts/setup.sh."""
    bin_dir = tmp_path / "bare" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(os.path.realpath(ROOT / ".venv" / "bin" / "python"))
    site = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    entry = {
        "command": str(bin_dir / "python"),
        "args": ["-m", "rig_mcp", "-i", str(ROOT / "inventory" / "local.yml"), "--read-only"],
        "env": {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PYTHONPATH": f"{ROOT}:{site}"},
    }
    (result,) = anyio.run(call_tools, launch(entry, tmp_path), [("list_rigs", {})])
    assert result.is_error
    text = result.content[0].text
    assert "\n" not in text and not text.startswith("Error executing tool"), text
    assert re.search(
        rf"ansible-inventory not found in {re.escape(str(bin_dir))}\b.*: run scripts/setup.sh$", text
    ), text


def test_a_broken_inventory_is_one_line_naming_it(tmp_path: Path) -> None:
    """The real runner, a real ansible-inventory and an inventory that does not parse."""
    bad = tmp_path / "bad.yml"
    bad.write_text("rigs: [unclosed\n")

    async def go() -> Any:
        server = build(Config(inventories=[str(bad)], read_only=True, lock_dir=tmp_path / "locks"))
        async with Client(server) as client:
            return await client.call_tool("list_models", {})

    result = anyio.run(go)
    assert result.is_error
    text = result.content[0].text
    assert "\n" not in text and text.startswith("ansible-inventory failed (rc "), text
    assert "Traceback" not in text
