"""rigctl inside the shared rig's container, then the MCP server (python -m rig_mcp) over stdio
with the SDK's own client against the same rig and inventory/local.yml.

Costs four vLLM starts (rigctl's restart after its stop; the server's swap there, restart after
its stop, swap back) and one quick bench cell. Leaves the rig serving tiny-emb4. A test that
needs what an earlier one leaves (the swapped rig) gets it from a fixture, which is a no-op in
file order: each test also runs alone.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.ansible_run import run_playbook
from tests.conftest import ROOT
from tests.e2e.rig import assert_serving, podman, served_build

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
RIG_START = "default"  # serving tiny-emb4, closed: checked by conftest.rig_start

RIG = "rig-local"
OTHER_MODEL = "tiny-w8a8"


def rigctl(container: str, *args: str, user: str | None = None) -> tuple[int, str]:
    """Run rigctl in the rig's container: (exit code, stdout + stderr)."""
    who = ["--user", user] if user else []
    res = podman("exec", *who, container, "rigctl", *args)
    return res.returncode, res.stdout + res.stderr


# --- rigctl -----------------------------------------------------------------------------------


def test_rigctl_help_names_every_subcommand(local_rig) -> None:
    rc, out = rigctl(local_rig.container, "--help")
    assert rc == 0, out
    assert "exit codes: 0 ok, 1 failed, 2 usage, 3 not serving" in out
    for sub, words in (
        ("status", "KV cache tokens"),
        ("start", "wait until it answers"),
        ("wait", "fail at once if it exits"),
        ("stop", "Stop vLLM"),
        ("restart", "Restart vLLM"),
        ("logs", "--follow"),
        ("query", "PROMPT".lower()),
        ("clamp", "exactly once"),
    ):
        rc, out = rigctl(local_rig.container, sub, "--help")
        assert rc == 0 and words in out, (sub, out)


def test_rigctl_status_clamp_logs_query_on_a_serving_rig(local_rig) -> None:
    rc, out = rigctl(local_rig.container, "status")
    assert rc == 0, out
    for line in (
        "service: active/running since ",
        "restarts: ",
        "health: ok",
        f"model: {local_rig.model}",
        "KV cache tokens: ",
        "clamp: present once",
        "cpu: ",
        "uptime: ",
    ):
        assert line in out, (line, out)
    assert rigctl(local_rig.container, "clamp") == (0, "clamp: present once\n")
    rc, out = rigctl(local_rig.container, "status", "--json")  # what the playbooks and the server read
    doc = json.loads(out)
    assert rc == 0 and doc["rigctl"] == 1 and doc["serving"] is True and doc["build"] == local_rig.model, out
    assert [c["name"] for c in doc["checks"] if c["ok"]] == ["clamp"], out
    rc, out = rigctl(local_rig.container, "logs", "-n", "5")
    assert rc == 0 and 0 < len(out.splitlines()) <= 5, out
    rc, out = rigctl(local_rig.container, "logs", "-n", "-1")
    assert rc == 2 and "must be 0 or more, got -1" in out
    rc, out = rigctl(local_rig.container, "query", "What is the capital of France?", "--max-tokens", "32")
    assert rc == 0 and out.startswith(f"{local_rig.model}: "), out
    assert "tokens: " in out


def test_rigctl_needs_root_to_read_tpu_env(local_rig) -> None:
    rc, out = rigctl(local_rig.container, "status", user="nobody")
    assert rc == 4, out
    assert "cannot read /etc/gemma-rig/tpu.env: permission denied (run rigctl as root)" in out


def test_rigctl_stop_then_restart_and_start(local_rig) -> None:
    assert rigctl(local_rig.container, "stop") == (0, "vllm: stopped\n")
    rc, out = rigctl(local_rig.container, "status")
    assert rc == 3, out
    # A clean stop, not a stop timeout (KillMode=process on the local profile: with mixed, systemd
    # in this cgroup v1 container waited out TimeoutStopSec and ended failed/failed), and the
    # ExecStopPost sweep left no process of the service user behind.
    assert "service: inactive/dead" in out, out
    assert (
        podman("exec", local_rig.container, "systemctl", "show", "vllm", "-p", "Result", "--value").stdout
        == "success\n"
    )
    leftovers = podman(
        "exec", local_rig.container, "sh", "-c", "stat -c %U /proc/[0-9]* 2>/dev/null | grep -cx vllm; true"
    )
    assert leftovers.stdout.strip() == "0", leftovers.stdout
    assert "health: down (-1)" in out and "model: none answering" in out, out
    rc, out = rigctl(local_rig.container, "query", "hi")
    assert rc == 1 and "no model answering" in out, out
    # restart brings a stopped unit up; start on a running one only waits until it answers (one
    # vLLM start for both: each costs minutes on a loaded 2-core machine).
    rc, out = rigctl(local_rig.container, "restart")
    assert rc == 0 and f"serving {local_rig.model} on http://127.0.0.1:{local_rig.port}" in out, out
    rc, out = rigctl(local_rig.container, "start")
    assert rc == 0 and f"serving {local_rig.model}" in out, out
    assert served_build(local_rig.port) == local_rig.model


# --- the MCP server ----------------------------------------------------------------------------


def server_params(lock_dir: Path, runs_dir: Path, *extra: str) -> StdioServerParameters:
    env = {k: os.environ[k] for k in ("ANSIBLE_CONFIG", "CONTAINERS_CONF", "PATH") if k in os.environ}
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "rig_mcp",
            "-i",
            "inventory/local.yml",
            "--lock-dir",
            str(lock_dir),
            "--runs-dir",
            str(runs_dir),
            *extra,
        ],
        cwd=str(ROOT),
        env={**env, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="module")
def mcp_dirs(local_rig, tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("mcp")
    yield base / "locks", base / "runs"
    # The next test files expect the rig as site.yml left it: serving tiny-emb4.
    if served_build(local_rig.port) != local_rig.model:
        back = run_playbook("swap.yml", "-e", f"model={local_rig.model}")
        assert back.rc == 0, back.output[-4000:]


@pytest.fixture
def serving_other_model(mcp_dirs, local_rig) -> None:
    """The rig serving OTHER_MODEL, as the server's swap test leaves it: swapped here only when a
    test that needs it runs without that one before it (mcp_dirs' teardown swaps back)."""
    if served_build(local_rig.port) != OTHER_MODEL:
        there = run_playbook("swap.yml", "-e", f"model={OTHER_MODEL}")
        assert there.rc == 0, there.output[-4000:]
    assert_serving(local_rig.container, local_rig.port, OTHER_MODEL)


def with_client(params: StdioServerParameters, body: Callable[[Client], Awaitable[Any]]) -> Any:
    async def go():
        async with Client(params) as client:
            return await body(client)

    return anyio.run(go)


def ok(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


def test_read_only_hides_the_mutating_tools(mcp_dirs) -> None:
    async def names(client: Client) -> set[str]:
        return {t.name for t in (await client.list_tools()).tools}

    full = with_client(server_params(*mcp_dirs), names)
    read_only = with_client(server_params(*mcp_dirs, "--read-only"), names)
    assert full - read_only == {"start", "stop", "restart", "swap", "bench"}
    assert read_only == {
        "list_rigs",
        "list_models",
        "status",
        "query",
        "logs",
        "check_capacity",
        "verify_clamp",
        "cost",  # it only reads the cloud API and the price table
        "metrics",  # it only reads Prometheus
    }


def test_bad_model_unknown_rig_and_negative_lines_are_clear_tool_errors(mcp_dirs) -> None:
    async def body(client: Client) -> list[tuple[bool, str]]:
        out = []
        for name, args in (
            ("swap", {"model": "no-such-model", "rigs": [RIG]}),
            ("status", {"rig": "no-such-rig"}),
            ("logs", {"rig": RIG, "lines": -3}),
        ):
            result = await client.call_tool(name, args)
            out.append((result.is_error, result.content[0].text))
        return out

    (e1, swap), (e2, status), (e3, logs) = with_client(server_params(*mcp_dirs), body)
    assert e1 and swap.endswith(
        "unknown model 'no-such-model': the catalog has bf16, emb4, google-w4a16, "
        "text, tiny-emb4, tiny-text, tiny-w4a16, tiny-w8a8, w8a8, xbill9-emb4, xbill9-w8a8"
    ), swap
    assert e2 and status.endswith("unknown rig 'no-such-rig': the inventory has rig-local"), status
    assert e3 and logs.endswith("lines must be between 0 and 10000, got -3"), logs


def test_read_only_tools_answer_from_the_rig(mcp_dirs, local_rig) -> None:
    async def body(client: Client) -> dict[str, Any]:
        out = {}
        for name, args in (
            ("list_rigs", {}),
            ("list_models", {}),
            ("status", {"rig": RIG}),
            ("verify_clamp", {"rig": RIG}),
            ("check_capacity", {"rig": RIG, "model": OTHER_MODEL}),
            ("logs", {"rig": RIG, "lines": 5}),
            ("query", {"prompt": "What is the capital of France?", "max_tokens": 32}),
        ):
            out[name] = ok(await client.call_tool(name, args))
        return out

    got = with_client(server_params(*mcp_dirs, "--read-only"), body)
    assert got["list_rigs"]["result"] == [
        {
            "rig": RIG,
            "platform": "local",
            "host": local_rig.container,
            "port": local_rig.port,
            "inventory_model": local_rig.model,
        }
    ]
    assert OTHER_MODEL in [m["model"] for m in got["list_models"]["result"]]
    status = got["status"]
    assert status["serving"] is True and status["service"] == "active/running", status
    assert status["model"] == local_rig.model and "clamp: present once" in status["lines"]
    assert got["verify_clamp"]["clamp"] == "present once"
    capacity = got["check_capacity"]
    assert capacity["fits"] is True and capacity["binding"] in ("disk", "memory"), capacity
    assert [t["name"] for t in capacity["terms"]] == ["disk", "memory"]  # no accelerator on the CPU rig
    mem_kib = podman("exec", local_rig.container, "grep", "^MemTotal:", "/proc/meminfo").stdout.split()[1]
    assert capacity["facts"]["mem_total_bytes"] == int(mem_kib) * 1024  # exact, not awk's rounding
    journal = got["logs"]["lines"]
    assert 0 < len(journal) <= 5 and all(re.match(r"^\d{4}-\d\d-\d\dT\S+ \S+ ", line) for line in journal), (
        journal
    )
    query = got["query"]
    assert query["rig"] == RIG and query["model"] == local_rig.model
    assert query["usage"]["completion_tokens"] > 0
    assert query["finish_reason"] in ("stop", "length"), query


def test_swap_reports_progress_and_a_concurrent_call_is_busy(mcp_dirs, local_rig) -> None:
    progress: list[str] = []
    outcome: dict[str, Any] = {}

    async def body() -> None:
        first_step = anyio.Event()

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(message or "")
            first_step.set()

        async with Client(server_params(*mcp_dirs)) as swapper, Client(server_params(*mcp_dirs)) as other:

            async def swap() -> None:
                outcome["swap"] = await swapper.call_tool(
                    "swap", {"model": OTHER_MODEL, "rigs": [RIG]}, progress_callback=on_progress
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(swap)
                await first_step.wait()
                outcome["restart"] = await other.call_tool("restart", {"rig": RIG})

    anyio.run(body)
    swap = ok(outcome["swap"])
    assert swap["model"] == OTHER_MODEL and swap["rigs"] == [RIG]
    assert any(m.startswith(f"{RIG}: {local_rig.model} -> {OTHER_MODEL};") for m in swap["messages"]), swap
    assert_serving(local_rig.container, local_rig.port, OTHER_MODEL)
    busy = outcome["restart"]
    assert busy.is_error
    assert f"busy: swap of {RIG} to {OTHER_MODEL} since " in busy.content[0].text, busy.content[0].text
    assert any(p.startswith("play: ") for p in progress), progress
    tasks = [p for p in progress if p.startswith("task: ")]
    assert "task: Look up the model in the catalog" in tasks, tasks
    assert len(tasks) >= 10, tasks  # one notification per task


def test_stop_start_restart_bench_and_swap_back(mcp_dirs, local_rig, serving_other_model) -> None:
    async def body(client: Client) -> dict[str, Any]:
        out = {"stop": ok(await client.call_tool("stop", {"rig": RIG}))}
        out["stopped"] = ok(await client.call_tool("status", {"rig": RIG}))
        # restart brings the stopped unit up; start on a running one waits until it answers.
        out["restart"] = ok(await client.call_tool("restart", {"rig": RIG}))
        out["start"] = ok(await client.call_tool("start", {"rig": RIG}))
        out["started"] = ok(await client.call_tool("status", {"rig": RIG}))
        out["bench"] = ok(await client.call_tool("bench", {"rig": RIG, "quick": True}))
        out["swap"] = ok(await client.call_tool("swap", {"model": local_rig.model, "rigs": [RIG]}))
        return out

    got = with_client(server_params(*mcp_dirs), body)
    assert got["stop"] == {"rig": RIG, "done": "stop"}
    # Stopped cleanly (seen through stop.yml): no stop timeout, nothing serves.
    assert got["stopped"]["service"] == "inactive/dead", got["stopped"]
    assert got["stopped"]["serving"] is False
    assert got["stopped"]["health"].startswith("down")
    assert got["started"]["serving"] is True and got["started"]["model"].startswith(OTHER_MODEL)
    assert got["restart"] == {"rig": RIG, "done": "restart"} and got["start"] == {"rig": RIG, "done": "start"}
    bench = got["bench"]
    assert Path(bench["run_dir"]).parent == mcp_dirs[1] and Path(bench["report"]).is_file()
    assert bench["summary"].startswith("|") and OTHER_MODEL in Path(bench["report"]).read_text()
    assert_serving(local_rig.container, local_rig.port, local_rig.model)
