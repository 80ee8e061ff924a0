"""The MCP server's pure parts: tool schemas, --read-only, the per-rig lock, error mapping,
secret redaction, the capacity terms, and the generated tool list in docs/mcp.md."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from rig_mcp import capacity, docs
from rig_mcp.locks import Busy, RigLocks
from rig_mcp.playbooks import ROOT, Failure, PlaybookRunner, PlayRun, failure_message
from rig_mcp.redact import MASK, Redactor
from rig_mcp.server import MUTATING, RIGCTL_SCHEMA, TOOLS, Config, build, clamp_state, summary_table

INVENTORY = {
    "_meta": {
        "hostvars": {
            "rig-local": {
                "rig_platform": "local",
                "ansible_host": "gemma-rig",
                "rig_port": 8000,
                "rig_model": "tiny-emb4",
                "rig_models": {
                    "tiny-emb4": {"description": "d", "source": {"kind": "repack"}, "size_bytes": 20}
                },
            },
        }
    },
    "all": {"children": ["ungrouped", "rigs"]},
    "rigs": {"children": ["local"]},
    "local": {"hosts": ["rig-local"]},
}


class FakeRunner(PlaybookRunner):
    """Answers as PlaybookRunner does (its PlayRun), from a script instead of ansible-runner."""

    def __init__(self, runs: dict[str, PlayRun] | None = None, steps: int = 0) -> None:
        super().__init__(["inventory/local.yml"])
        self.runs = runs or {}
        self.calls: list[tuple[str, str | None, dict]] = []
        self.steps = steps

    def inventory(self) -> dict[str, Any]:
        return INVENTORY

    def run(self, playbook, limit=None, extravars=None, on_step=None) -> PlayRun:
        self.calls.append((playbook, limit, extravars or {}))
        for i in range(self.steps):
            if on_step:
                on_step(f"task: step {i}")
        return self.runs.get(playbook, PlayRun(playbook, "successful", 0))


def call(config: Config, runner: PlaybookRunner, name: str, args: dict, progress=None):
    async def go():
        async with Client(build(config, runner)) as client:
            return await client.call_tool(name, args, progress_callback=progress)

    return anyio.run(go)


def tool_names(config: Config) -> set[str]:
    async def go():
        async with Client(build(config, FakeRunner())) as client:
            return {t.name for t in (await client.list_tools()).tools}

    return anyio.run(go)


def test_every_tool_is_listed_with_a_typed_schema(tmp_path) -> None:
    async def go():
        async with Client(build(Config(lock_dir=tmp_path), FakeRunner())) as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    tools = anyio.run(go)
    assert set(tools) == set(TOOLS)
    assert tools["logs"].input_schema["properties"]["lines"]["type"] == "integer"
    assert tools["logs"].input_schema["properties"]["lines"]["minimum"] == 0
    assert tools["swap"].input_schema["properties"]["rigs"]["type"] == "array"
    assert tools["swap"].input_schema["required"] == ["model", "rigs"]
    assert tools["bench"].input_schema["properties"]["quick"]["default"] is True
    assert tools["status"].annotations.read_only_hint is True
    assert tools["swap"].annotations.read_only_hint is False


def test_read_only_hides_exactly_the_mutating_tools(tmp_path) -> None:
    assert tool_names(Config(read_only=True, lock_dir=tmp_path)) == set(TOOLS) - set(MUTATING)
    assert set(MUTATING) == {"start", "stop", "restart", "swap", "bench"}


def test_the_generated_tool_list_in_docs_matches_the_schemas() -> None:
    current = docs.DOC.read_text()
    assert docs.render(current) == current, "docs/mcp.md is out of date: run python -m rig_mcp.docs"
    for name in TOOLS:
        assert f"| `{name}` |" in current


def test_a_second_holder_is_refused_with_what_holds_the_rig(tmp_path) -> None:
    locks = RigLocks(tmp_path, clock=lambda: time.mktime((2026, 1, 1, 12, 3, 0, 0, 0, -1)))
    with locks.hold(["rig-local"], "swap of rig-local to tiny-w8a8"):
        with (
            pytest.raises(Busy, match=r"^busy: swap of rig-local to tiny-w8a8 since 12:03$"),
            locks.hold(["rig-local"], "stop of rig-local"),
        ):
            pass
        with locks.hold(["rig-b"], "stop of rig-b"):  # another rig is free
            pass
    with locks.hold(["rig-local"], "stop of rig-local"):  # released
        pass


def test_the_lock_holds_across_processes(tmp_path) -> None:
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from rig_mcp.locks import RigLocks
        with RigLocks(Path({str(tmp_path)!r})).hold(["rig-local"], "bench of rig-local"):
            print("held", flush=True)
            time.sleep(30)
    """)
    env = {**os.environ, "PYTHONPATH": str(docs.ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(Busy, match=r"^busy: bench of rig-local since "),
            RigLocks(tmp_path).hold(["rig-local"], "stop of rig-local"),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    with RigLocks(tmp_path).hold(["rig-local"], "stop of rig-local"):  # the dead holder's lock is gone
        pass


def test_a_failed_play_is_a_tool_error_naming_task_and_message(tmp_path) -> None:
    failed = PlayRun(
        "playbooks/start.yml",
        "failed",
        2,
        failure=Failure(
            "rig-local",
            "Wait until vLLM answers, serving tiny-emb4",
            "vLLM exited while starting; Authorization: Bearer s3cr3t-token",
        ),
    )
    result = call(
        Config(lock_dir=tmp_path), FakeRunner({"playbooks/start.yml": failed}), "start", {"rig": "rig-local"}
    )
    assert result.is_error
    text = result.content[0].text
    assert (
        "playbooks/start.yml failed on rig-local at task 'Wait until vLLM answers, serving tiny-emb4" in text
    )
    assert "vLLM exited while starting" in text
    assert "s3cr3t-token" not in text and "Traceback" not in text


def test_unknown_rig_model_and_negative_lines_are_clear_tool_errors(tmp_path) -> None:
    runner = FakeRunner()
    config = Config(lock_dir=tmp_path)
    bad = {
        ("status", "rig"): ({"rig": "nope"}, "unknown rig 'nope': the inventory has rig-local"),
        ("swap", "model"): (
            {"model": "nope", "rigs": ["rig-local"]},
            "unknown model 'nope': the catalog has tiny-emb4",
        ),
        ("logs", "lines"): ({"rig": "rig-local", "lines": -1}, "lines must be between 0 and 10000, got -1"),
    }
    for (tool, _), (args, message) in bad.items():
        result = call(config, runner, tool, args)
        assert result.is_error, tool
        assert result.content[0].text.endswith(message), result.content[0].text
    assert runner.calls == []  # refused before any playbook ran


def test_a_mutating_call_is_refused_while_the_rig_is_locked(tmp_path) -> None:
    runner = FakeRunner()
    with RigLocks(tmp_path).hold(["rig-local"], "swap of rig-local to tiny-w8a8"):
        result = call(Config(lock_dir=tmp_path), runner, "restart", {"rig": "rig-local"})
    assert result.is_error
    assert "busy: swap of rig-local to tiny-w8a8 since " in result.content[0].text
    assert runner.calls == []
    assert not call(Config(lock_dir=tmp_path), runner, "restart", {"rig": "rig-local"}).is_error


def test_each_play_step_is_a_progress_notification(tmp_path) -> None:
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))

    call(Config(lock_dir=tmp_path), FakeRunner(steps=3), "stop", {"rig": "rig-local"}, progress)
    assert seen == [(1, "task: step 0"), (2, "task: step 1"), (3, "task: step 2")]


def test_redactor_masks_tokens_secret_pairs_and_known_values() -> None:
    r = Redactor(values=["hunter2-long"])
    assert r.text("Authorization: Bearer abc.def") == f"Authorization: Bearer {MASK}"
    assert r.text("VLLM_API_KEY=abc123 RIG_PORT=8000") == f"VLLM_API_KEY={MASK} RIG_PORT=8000"
    assert r.text('{"HF_TOKEN": "hf_x"}') == f'{{"HF_TOKEN": {MASK}}}'
    assert r.text("pw is hunter2-long") == f"pw is {MASK}"
    assert r({"lines": ["MY_SECRET=x"], "rig": "rig-local"}) == {
        "lines": [f"MY_SECRET={MASK}"],
        "rig": "rig-local",
    }


def test_failure_message_prefers_msg_then_the_command_output() -> None:
    assert (
        failure_message({"msg": "non-zero return code", "stderr": "boom\n"}) == "non-zero return code\nboom"
    )
    assert failure_message({"stdout": "a\nb"}) == "a\nb"
    assert "no_log" in failure_message(
        {"censored": "the output has been hidden due to the fact that 'no_log: true'"}
    )


def test_capacity_names_the_binding_term() -> None:
    gib = capacity.GIB
    gpu = {
        "disk_free_bytes": 100 * gib,
        "mem_total_bytes": 8 * gib,
        "swap_total_bytes": 16 * gib,
        "accelerator_total_bytes": 15 * gib,
    }
    fits = capacity.verdict("t4", "emb4", capacity.terms(gpu, 3 * gib, 0.9, 0))
    assert fits["fits"] and fits["binding"] == "accelerator memory"
    # 15 x 0.9 - 13 - 1 < 0: the accelerator is short.
    short = capacity.verdict("t4", "big", capacity.terms(gpu, 13 * gib, 0.9, 0))
    assert not short["fits"] and short["binding"] == "accelerator memory"
    assert short["summary"] == "big does not fit t4: accelerator memory is short by 0.50 GiB"
    cpu = {
        "disk_free_bytes": 1 * gib,
        "mem_total_bytes": 8 * gib,
        "swap_total_bytes": 0,
        "accelerator_total_bytes": None,
    }
    disk = capacity.verdict("local", "m", capacity.terms(cpu, 2 * gib, 0.9, gib))
    assert disk["binding"] == "disk" and not disk["fits"]
    assert [t["name"] for t in disk["terms"]] == ["disk", "memory"]
    memory = capacity.verdict(
        "local", "m", capacity.terms({**cpu, "disk_free_bytes": 50 * gib}, 6 * gib, 0.9, gib)
    )
    assert memory["binding"] == "memory" and memory["fits"] is True  # 8 - 6 - 1 - 1 = 0


def test_clamp_state_and_report_table() -> None:
    assert clamp_state(0, "clamp-check: turing clamp present once in f") == "present once"
    assert clamp_state(1, "clamp-check: turing clamp missing from f (vLLM reinstalled?)") == "absent"
    assert (
        clamp_state(1, "clamp-check: turing clamp present 2 times in f; expected exactly once") == "doubled"
    )
    assert summary_table("# R\n\ntext\n| a | b |\n|---|---|\n| 1 | 2 |\n\nmore\n| x |") == (
        "| a | b |\n|---|---|\n| 1 | 2 |"
    )


def test_the_server_runs_over_stdio_and_answers_list_rigs(repo_root: Path) -> None:
    """The real entry point (python -m rig_mcp) with the SDK's stdio client and the real inventory."""
    from mcp import StdioServerParameters

    async def go():
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "rig_mcp", "--read-only"],
            cwd=str(repo_root),
            env={"PYTHONPATH": str(repo_root)},
        )
        async with Client(params) as client:
            return await client.call_tool("list_rigs", {})

    result = anyio.run(go)
    assert not result.is_error, result.content
    assert result.structured_content["result"][0]["rig"] == "rig-local"


def test_the_server_serves_streamable_http_behind_a_flag(repo_root: Path) -> None:
    """--http: the SDK's client reaches the tools at http://HOST:PORT/mcp, with the bearer token
    HTTP always asks for (test_mcp_http_auth.py tries it without)."""
    token = "a-token-for-the-http-transport-test"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "rig_mcp", "--read-only", "--http", "--port", str(port)],
        cwd=repo_root,
        env={**os.environ, "PYTHONPATH": str(repo_root), "RIG_MCP_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):  # until it listens (or exits)
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, "the HTTP server exited"
            time.sleep(0.1)

        async def go():
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)) as client,
            ):
                return {t.name for t in (await client.list_tools()).tools}

        assert anyio.run(go) == set(TOOLS) - set(MUTATING)
    finally:
        server.terminate()
        server.wait(timeout=30)


def chat_run(content: str | None, reasoning: str, calls: list | None = None) -> PlayRun:
    """query.yml's results as ansible-runner reports them: rigctl's query report on stdout."""
    answer = (content or "").strip()
    doc = {"rigctl": RIGCTL_SCHEMA, "command": "query", "ok": True, "model": "tiny-emb4", "answer": answer,
           "reasoning_only": not answer and not calls and bool(reasoning), "reasoning_chars": len(reasoning),
           "tool_calls": calls or [],
           "finish_reason": "length", "usage": {"prompt_tokens": 9, "completion_tokens": 32},
           "answered_by": None, "lines": [f"tiny-emb4: {answer}"]}  # fmt: skip
    return PlayRun(
        "playbooks/query.yml",
        "successful",
        0,
        results=[
            {"task": "Ask rigctl", "host": "rig-local", "res": {"stdout": json.dumps(doc)}, "failed": False}
        ],
    )


def test_query_flags_a_reply_that_is_reasoning_only(tmp_path) -> None:
    runner = FakeRunner({"playbooks/query.yml": chat_run(None, "Let me think")})
    got = call(Config(lock_dir=tmp_path), runner, "query", {"prompt": "Capital of France?", "max_tokens": 32})
    assert got.structured_content["reasoning_only"] is True
    assert got.structured_content["note"] == (
        "reasoning only: no answer within max_tokens (32); raise it (reasoning so far: 12 characters)"
    )
    assert runner.calls == [
        ("playbooks/query.yml", "rig-local", {"prompt": "Capital of France?", "max_tokens": 32})
    ]
    runner = FakeRunner({"playbooks/query.yml": chat_run("Paris", "Let me think")})
    got = call(Config(lock_dir=tmp_path), runner, "query", {"prompt": "Capital of France?"})
    assert got.structured_content["reasoning_only"] is False and got.structured_content["answer"] == "Paris"


def test_query_reports_a_tool_call_the_model_made_not_an_empty_answer(tmp_path) -> None:
    name = "get_capital{{ 7*7 }}$(touch x)"
    calls = [{"id": "c1", "name": name, "arguments": "{\"country\": \"{{ lookup('pipe', 'id') }}\"}"}]
    runner = FakeRunner({"playbooks/query.yml": chat_run(None, "", calls)})
    got = call(
        Config(lock_dir=tmp_path), runner, "query", {"prompt": "Capital of France?"}
    ).structured_content
    assert (got["answer"], got["reasoning_only"], got["tool_calls"]) == ("", False, calls)
    assert "note" not in got


def capacity_run(disk_free: int, mem_total: int = 8 * capacity.GIB, served: str = "tiny-emb4") -> PlayRun:
    facts = {
        "disk_free_bytes": disk_free,
        "disk_path": "/opt1",
        "served_key": served,
        "mem_total_bytes": mem_total,
        "mem_available_bytes": 4 * capacity.GIB,
        "swap_total_bytes": 0,
        "accelerator_total_bytes": None,
    }
    return PlayRun(
        "playbooks/capacity.yml",
        "successful",
        0,
        results=[{"task": "Show the capacity", "host": "rig-local", "res": {"msg": facts}, "failed": False}],
    )


def test_swap_is_refused_when_the_build_does_not_fit(tmp_path) -> None:
    runner = FakeRunner({"playbooks/capacity.yml": capacity_run(10)})
    got = call(Config(lock_dir=tmp_path), runner, "swap", {"model": "tiny-emb4", "rigs": ["rig-local"]})
    assert got.is_error
    assert got.content[0].text.endswith(
        "swap refused: tiny-emb4 does not fit rig-local: disk is short by 0.00 GiB"
    )
    assert [c[0] for c in runner.calls] == ["playbooks/capacity.yml"]  # swap.yml never ran
    runner = FakeRunner({"playbooks/capacity.yml": capacity_run(capacity.GIB)})
    assert not call(
        Config(lock_dir=tmp_path), runner, "swap", {"model": "tiny-emb4", "rigs": ["rig-local"]}
    ).is_error
    assert [c[0] for c in runner.calls] == ["playbooks/capacity.yml", "playbooks/swap.yml"]
    # The limit keeps swap.yml's controller play (the catalog check and the build) in the run.
    assert runner.calls[1][1:] == ("rig-local,localhost", {"model": "tiny-emb4"})


def test_capacity_reads_the_flags_the_unit_gets() -> None:
    """The profiles' own flag mappings (inventory/group_vars), with a host's changes on top."""
    root = Path(__file__).resolve().parents[2]
    local = yaml.safe_load((root / "inventory" / "group_vars" / "local.yml").read_text())
    gce = yaml.safe_load((root / "inventory" / "group_vars" / "gce.yml").read_text())
    assert capacity.vllm_memory_flags(local) == (0.9, 268435456)
    assert capacity.vllm_memory_flags(gce) == (0.9, 0)
    host = {**gce, "rig_vllm_host_flags": {"gpu-memory-utilization": 0.8, "kv-cache-memory-bytes": None}}
    assert capacity.vllm_memory_flags(host) == (0.8, 0)


@pytest.mark.parametrize("verb", ["start", "restart"])
def test_start_is_refused_when_memory_cannot_hold_the_served_build(tmp_path, verb: str) -> None:
    """The build tpu.env names must fit host memory (the disk already holds it: not counted)."""
    short = FakeRunner({"playbooks/capacity.yml": capacity_run(0, mem_total=capacity.GIB)})
    got = call(Config(lock_dir=tmp_path), short, verb, {"rig": "rig-local"})
    assert got.is_error
    assert f"{verb} refused: tiny-emb4 does not fit rig-local: memory is short by " in got.content[0].text
    assert [c[0] for c in short.calls] == ["playbooks/capacity.yml"]  # the unit was never touched
    room = FakeRunner(
        {
            "playbooks/capacity.yml": capacity_run(0),
            f"playbooks/{verb}.yml": PlayRun(f"playbooks/{verb}.yml", "successful", 0),
        }
    )
    assert not call(Config(lock_dir=tmp_path), room, verb, {"rig": "rig-local"}).is_error
    assert [c[0] for c in room.calls] == ["playbooks/capacity.yml", f"playbooks/{verb}.yml"]


def rigctl_run(playbook: str, task: str, report: dict | str) -> PlayRun:
    """A playbook run whose ``task`` registered rigctl's --json output."""
    stdout = report if isinstance(report, str) else json.dumps(report)
    res = {"task": task, "host": "rig-local", "res": {"rc": 0, "stdout": stdout}, "failed": False}
    return PlayRun(playbook, "successful", 0, results=[res])


HOSTILE = "{{ lookup('pipe', 'id') }} $(id) Authorization: Bearer s3cr3t-token"


def test_status_verify_clamp_and_logs_read_rigctls_json(tmp_path) -> None:
    """The tools read rigctl's report (its schema: docs/mcp.md), not its words; what the rig holds
    arrives as data, secrets redacted."""
    report = {
        "rigctl": RIGCTL_SCHEMA, "command": "status", "ok": True, "serving": True,
        "service": {"active": "active", "sub": "running"}, "health": 200, "build": HOSTILE,
        "aliases": ["tiny-gemma-4"], "lines": [f"model: {HOSTILE}"],
        "checks": [{"name": "clamp", "ok": False, "words": "clamp-check: turing clamp present 2 times in f"}],
    }  # fmt: skip
    status = rigctl_run("playbooks/status.yml", "Ask rigctl for the status", report)
    logs = rigctl_run("playbooks/logs.yml", "Read the journal", {"rigctl": 1, "lines": ["a", HOSTILE]})
    runner = FakeRunner({"playbooks/status.yml": status, "playbooks/logs.yml": logs})
    cfg = Config(lock_dir=tmp_path, read_only=True)
    got = call(cfg, runner, "status", {"rig": "rig-local"}).structured_content
    shown = HOSTILE.replace("s3cr3t-token", MASK)
    assert got == {"rig": "rig-local", "service": "active/running", "serving": True, "health": "ok",
                   "model": shown, "alias": "tiny-gemma-4", "lines": [f"model: {shown}"],
                   "recovery": ""}  # fmt: skip
    clamp = call(cfg, runner, "verify_clamp", {"rig": "rig-local"}).structured_content
    assert clamp == {"rig": "rig-local", "clamp": "doubled", "detail": report["checks"][0]["words"]}
    assert call(cfg, runner, "logs", {"rig": "rig-local", "lines": 1}).structured_content["lines"] == [shown]
    tpu = rigctl_run("playbooks/status.yml", "Ask rigctl for the status", {**report, "checks": []})
    clamp = call(cfg, FakeRunner({"playbooks/status.yml": tpu}), "verify_clamp", {"rig": "rig-local"})
    assert clamp.structured_content["clamp"] == "not used on this platform"


def test_status_carries_the_gateways_word_on_a_spot_rigs_recovery(tmp_path) -> None:
    """status.yml runs on the gateways too; their gateway-ctl status --text line for the rig carries
    rig-waker's recovery, which the tool hands on (redacted like the rest)."""
    report = {"rigctl": RIGCTL_SCHEMA, "service": {"active": "active", "sub": "running"}, "health": 200}
    run = rigctl_run("playbooks/status.yml", "Ask rigctl for the status", report)
    words = "preempted at 2026-12-03T14:56:21.747-08:00, started again at 2026-12-03T22:56:21+00:00"
    lines = [
        "rig-localx: UP (check L7OK), model m, 0 request(s) now, 0 served; recovery: not this rig's",
        f"rig-local: UP (check L7OK), model m, 0 request(s) now, 3 served; recovery: {words}",
    ]
    gateway = {"rc": 0, "stdout": "\n".join(lines)}
    run.results.append({"task": "Ask the gateway through its runtime API", "host": "gw", "res": gateway})
    runner = FakeRunner({"playbooks/status.yml": run})
    got = call(Config(lock_dir=tmp_path), runner, "status", {"rig": "rig-local"}).structured_content
    assert got["recovery"] == words
    assert runner.calls[-1][:2] == ("playbooks/status.yml", "rig-local,gateways")
    hostile = {"rc": 0, "stdout": f"rig-local: UP; recovery: {HOSTILE}"}
    run.results[-1] = {"task": "Ask the gateway through its runtime API", "host": "gw", "res": hostile}
    got = call(Config(lock_dir=tmp_path), runner, "status", {"rig": "rig-local"}).structured_content
    assert got["recovery"] == HOSTILE.replace("s3cr3t-token", MASK)


@pytest.mark.parametrize("stdout", ["", "not json", "[1]", json.dumps({"rigctl": RIGCTL_SCHEMA + 1})])
def test_a_report_that_is_not_rigctls_is_a_tool_error(tmp_path, stdout: str) -> None:
    run = rigctl_run("playbooks/status.yml", "Ask rigctl for the status", stdout)
    got = call(
        Config(lock_dir=tmp_path), FakeRunner({"playbooks/status.yml": run}), "status", {"rig": "rig-local"}
    )
    assert got.is_error
    assert (
        got.content[0].text
        == f"playbooks/status.yml got no rigctl report (schema {RIGCTL_SCHEMA}) from rig-local"
    )


def test_the_server_reads_the_schema_rigctl_writes() -> None:
    spec = importlib.util.spec_from_file_location("rigctl", ROOT / "roles/vllm_service/files/rigctl.py")
    rigctl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rigctl)
    assert rigctl.SCHEMA == RIGCTL_SCHEMA
