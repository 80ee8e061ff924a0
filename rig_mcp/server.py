"""The gemma-rig MCP server: every rig in the inventory, driven through the project's playbooks.

    python -m rig_mcp [-i inventory/local.yml ...] [--read-only] [--lock-dir D]
                      [--http [--host H] [--port P] [--token-file F]
                              [--tls-cert F --tls-key F | --tls self-signed]
                              [--allowed-host H:P ...] [--allowed-origin URL ...]]

Runs on the controller. Each tool runs one playbook with ansible-runner (never a shell of its
own), reports each play and task as an MCP progress notification, and turns a failed play into a
tool error naming the failing task and its message. Mutating tools hold a per-rig lock
(rig_mcp.locks). Every result passes through rig_mcp.redact. docs/mcp.md lists the tools.

Every argument is untrusted data: it reaches a playbook as an !unsafe extra variable
(rig_mcp.playbooks), never as a template, a shell word or an unchecked path. Over HTTP a bearer
token (--token-file or RIG_MCP_TOKEN) is always required, off loopback the server speaks TLS only,
and Host/Origin are checked (rig_mcp.http_guard).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from rig_mcp import capacity
from rig_mcp.http_guard import (
    TOKEN_ENV,
    StartRefused,
    StaticToken,
    http_security,
    http_tls,
    http_token,
    is_loopback,
    read_token_file,
    say,
    serve,
)
from rig_mcp.locks import Busy, RigLocks, UnsafeLockDir, default_lock_dir, private_dir
from rig_mcp.playbooks import ROOT, PlaybookFailed, PlaybookRunner, PlayRun
from rig_mcp.redact import DEFAULT_PATTERNS, Redactor

log = logging.getLogger(__name__)

SERVER_NAME = "gemma-rig"
DEFAULT_INVENTORY = "inventory/local.yml"
MAX_LOG_LINES = 10000
RIGCTL_SCHEMA = 1  # the rigctl JSON this server reads (docs/mcp.md)
# bench(quick=True): one cell and no decode check, about a minute on the local rig.
QUICK_GRID: dict[str, Any] = {
    "bench_input_lens": [128],
    "bench_concurrency": [1],
    "bench_output_len": 16,
    "bench_repeats": 1,
    "bench_decode_runs": 0,
}

RigName = Annotated[str, Field(description="A rig's inventory name (see list_rigs).", min_length=1)]
ModelKey = Annotated[str, Field(description="A catalog key (see list_models).", min_length=1)]

# Which tools change a rig (held under the rig lock, hidden by --read-only).
MUTATING = ("start", "stop", "restart", "swap", "bench")
# status.yml's task that registers gateway-ctl status --text on each gateway.
GATEWAY_STATUS_TASK = "Ask the gateway through its runtime API"
# status.yml's task that registers gateway-ctl metrics (JSON) on each gateway, or on the controller.
METRICS_TASK = "Ask Prometheus for the metrics view"
METRICS_MINUTES_MAX = 1440  # gateway-ctl metrics' own bound
NO_PROMETHEUS = 3  # gateway-ctl metrics' exit code when Prometheus does not answer


def gateway_recovery(run: PlayRun, rig: str) -> str:
    """What a gateway's rig-waker says of ``rig``'s spot recovery, from status.yml's gateway-ctl
    status --text lines (``RIG: ...; recovery: WORDS``); "" when no gateway says anything."""
    for result in run.results:
        if result.get("task") != GATEWAY_STATUS_TASK:
            continue
        for line in str((result.get("res") or {}).get("stdout") or "").splitlines():
            head, sep, words = line.partition("; recovery: ")
            if sep and head.startswith(f"{rig}: "):
                return words.strip()
    return ""


@dataclass
class Config:
    inventories: list[str] = field(default_factory=lambda: [DEFAULT_INVENTORY])
    read_only: bool = False
    lock_dir: Path = field(default_factory=default_lock_dir)
    runs_dir: Path | None = None  # bench records; None: evidence/runs (and INDEX.md regenerated)


class RigServer:
    """The tools' implementations, over one inventory."""

    def __init__(self, config: Config, runner: PlaybookRunner | None = None) -> None:
        self.config = config
        self.runner = runner or PlaybookRunner(config.inventories)
        self.locks = RigLocks(config.lock_dir)
        self._inventory: dict[str, Any] | None = None
        self.redact = Redactor(DEFAULT_PATTERNS)

    # --- the inventory -------------------------------------------------------------------
    def inventory(self) -> dict[str, Any]:
        if self._inventory is None:
            self._inventory = self.runner.inventory()
            hostvars = self._inventory.get("_meta", {}).get("hostvars", {})
            patterns = next(
                (
                    hv.get("rig_secret_name_patterns")
                    for hv in hostvars.values()
                    if hv.get("rig_secret_name_patterns")
                ),
                DEFAULT_PATTERNS,
            )
            self.redact = Redactor(patterns)
        return self._inventory

    def rig_names(self) -> list[str]:
        inv = self.inventory()
        names: list[str] = []

        def walk(group: str) -> None:
            for host in inv.get(group, {}).get("hosts", []):
                if host not in names:
                    names.append(host)
            for child in inv.get(group, {}).get("children", []):
                walk(child)

        walk("rigs")
        return names

    def hostvars(self, rig: str) -> dict[str, Any]:
        return self.inventory()["_meta"]["hostvars"].get(rig, {})

    def check_rig(self, rig: str) -> str:
        names = self.rig_names()
        if rig not in names:
            raise ToolError(f"unknown rig {rig!r}: the inventory has {', '.join(names) or 'no rigs'}")
        return rig

    def catalog(self) -> dict[str, Any]:
        for rig in self.rig_names():
            models = self.hostvars(rig).get("rig_models")
            if models:
                return models
        return {}

    def check_model(self, model: str) -> str:
        keys = sorted(self.catalog())
        if model not in keys:
            raise ToolError(f"unknown model {model!r}: the catalog has {', '.join(keys)}")
        return model

    # --- running playbooks ---------------------------------------------------------------
    async def play(
        self,
        ctx: Context | None,
        playbook: str,
        limit: str,
        extravars: dict[str, Any] | None = None,
    ) -> PlayRun:
        """Run a playbook in a worker thread, a progress notification per play and task."""
        steps = 0

        def on_step(step: str) -> None:
            nonlocal steps
            steps += 1
            if ctx is not None:
                anyio.from_thread.run(partial(ctx.report_progress, steps, None, self.redact(step)))

        try:
            run = await anyio.to_thread.run_sync(
                partial(self.runner.run, playbook, limit=limit, extravars=extravars, on_step=on_step)
            )
        except PlaybookFailed as exc:
            raise ToolError(self.redact(str(exc))) from None
        if run.failure is not None:
            raise ToolError(self.redact(run.failure.describe(playbook)))
        return run

    @contextmanager
    def mutating(self, rigs: list[str], what: str) -> Iterator[None]:
        try:
            with self.locks.hold(rigs, what):
                yield
        except (Busy, UnsafeLockDir) as exc:
            raise ToolError(str(exc)) from None

    # --- tools ---------------------------------------------------------------------------
    def list_rigs(self) -> list[dict[str, Any]]:
        out = []
        for rig in self.rig_names():
            hv = self.hostvars(rig)
            out.append(
                {
                    "rig": rig,
                    "platform": hv.get("rig_platform"),
                    "host": hv.get("ansible_host", rig),
                    "port": hv.get("rig_port"),
                    "inventory_model": hv.get("rig_model"),
                }
            )
        return self.redact(out)

    def list_models(self) -> list[dict[str, Any]]:
        out = []
        for name, entry in sorted(self.catalog().items()):
            source = entry.get("source", {})
            out.append(
                {
                    "model": name,
                    "description": entry.get("description", ""),
                    "kind": source.get("kind"),
                    "target": source.get("target"),
                    "size_bytes": entry.get("size_bytes"),
                }
            )
        return out

    async def rigctl(
        self,
        ctx: Context | None,
        playbook: str,
        task: str,
        rig: str,
        extravars: dict[str, Any] | None = None,
        runs: list[PlayRun] | None = None,
        also: str = "",
    ) -> dict[str, Any]:
        """The JSON object rigctl printed (docs/mcp.md, its schema) in ``task`` of ``playbook``;
        ``also``: more hosts in the run (a limit pattern), which is handed back in ``runs``."""
        run = await self.play(ctx, playbook, self.check_rig(rig) + (f",{also}" if also else ""), extravars)
        if runs is not None:
            runs.append(run)
        try:
            doc = json.loads((run.result(task, rig) or {}).get("stdout") or "")
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("rigctl") != RIGCTL_SCHEMA:
            raise ToolError(f"{playbook} got no rigctl report (schema {RIGCTL_SCHEMA}) from {rig}")
        return doc

    async def status(self, rig: str, ctx: Context | None = None) -> dict[str, Any]:
        runs: list[PlayRun] = []
        # The gateways too: their rig-waker tells a spot rig's recovery (gateway-ctl status).
        doc = await self.rigctl(ctx, "playbooks/status.yml", "Ask rigctl for the status", rig, runs=runs,
                                also="gateways")  # fmt: skip
        service = doc.get("service") or {}
        aliases = doc.get("aliases") or []
        return self.redact(
            {
                "rig": rig,
                "service": f"{service.get('active')}/{service.get('sub')}",
                "serving": doc.get("serving") is True,
                "health": "ok" if doc.get("health") == 200 else f"down ({doc.get('health')})",
                "model": doc.get("build"),
                "alias": aliases[0] if aliases else "",
                "lines": doc.get("lines") or [],
                "recovery": gateway_recovery(runs[0], rig),
            }
        )

    async def metrics(self, minutes: int, ctx: Context | None = None) -> dict[str, Any]:
        """Each rig's last ``minutes`` from Prometheus, as gateway-ctl metrics reads it on every
        gateway (or on the controller, for a fleet with no gateway): status.yml's metrics task."""
        if (
            isinstance(minutes, bool)
            or not isinstance(minutes, int)
            or not 1 <= minutes <= METRICS_MINUTES_MAX
        ):
            raise ToolError(
                f"minutes must be a whole number from 1 to {METRICS_MINUTES_MAX}, got {minutes!r}"
            )
        run = await self.play(
            ctx,
            "playbooks/status.yml",
            "gateways,localhost",
            {"metrics_minutes": minutes, "status_metrics_only": True},
        )
        views: list[dict[str, Any]] = []
        for result in run.results:
            res = result.get("res") or {}
            # A skipped task (the controller's, when there are gateways) has no rc.
            if result.get("task") != METRICS_TASK or res.get("skipped") or "rc" not in res:
                continue
            host = str(result.get("host") or "")
            if res.get("rc") == NO_PROMETHEUS:
                views.append({"host": host, "monitoring": False, "note": one_line(res.get("stderr") or "")})
                continue
            try:
                doc = json.loads(res.get("stdout") or "")
            except ValueError:
                doc = None
            if not isinstance(doc, dict) or not isinstance(doc.get("rigs"), dict):
                raise ToolError(f"gateway-ctl metrics on {host} printed no metrics view")
            views.append({"host": host, "monitoring": True, **doc})
        if not views:
            raise ToolError(
                "status.yml ran gateway-ctl metrics nowhere (no gateway, and not on the controller)"
            )
        return self.redact({"minutes": minutes, "views": views})

    async def verify_clamp(self, rig: str, ctx: Context | None = None) -> dict[str, Any]:
        doc = await self.rigctl(ctx, "playbooks/status.yml", "Ask rigctl for the status", rig)
        clamp = next((c for c in doc.get("checks") or [] if c.get("name") == "clamp"), None)
        if clamp is None:
            return {"rig": rig, "clamp": "not used on this platform", "detail": ""}
        words = str(clamp.get("words") or "")
        state = clamp_state(0 if clamp.get("ok") is True else 1, words)
        return {"rig": rig, "clamp": state, "detail": self.redact(words)}

    async def logs(self, rig: str, lines: int, ctx: Context | None = None) -> dict[str, Any]:
        if not 0 <= lines <= MAX_LOG_LINES:
            raise ToolError(f"lines must be between 0 and {MAX_LOG_LINES}, got {lines}")
        doc = await self.rigctl(ctx, "playbooks/logs.yml", "Read the journal", rig, {"lines": lines})
        got = [str(line) for line in doc.get("lines") or []]
        return {"rig": rig, "lines": self.redact(got[-lines:] if lines else [])}

    async def query(
        self,
        prompt: str,
        rig: str | None,
        max_tokens: int,
        ctx: Context | None = None,
        agent: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        target = self.check_rig(rig) if rig else (self.rig_names() or [""])[0]
        if not target:
            raise ToolError("the inventory has no rigs")
        # tools and response_format, when given, go to rigctl's request as data (the runner's extra
        # variables are never templates), for vLLM to check.
        extra = {"agent_request": agent} if agent else {}
        doc = await self.rigctl(
            ctx,
            "playbooks/query.yml",
            "Ask rigctl",
            target,
            {"prompt": prompt, "max_tokens": max_tokens, **extra},
        )
        answer = str(doc.get("answer") or "")
        # A call the model made is its answer, not an empty one: shown as rigctl read it, never run.
        calls = [c for c in doc.get("tool_calls") or [] if isinstance(c, dict)]
        result = {
            "rig": target,
            "model": doc.get("model") or "",
            "answer": answer,
            "tool_calls": [{k: str(c.get(k) or "") for k in ("id", "name", "arguments")} for c in calls],
            "finish_reason": doc.get("finish_reason"),
            "usage": doc.get("usage") or {},
            "reasoning_only": not answer and not calls,
        }
        if result["reasoning_only"]:
            reasoning = doc.get("reasoning_chars") or 0
            result["note"] = f"reasoning only: no answer within max_tokens ({max_tokens}); raise it" + (
                f" (reasoning so far: {reasoning} characters)" if reasoning else ""
            )
        return self.redact(result)

    async def check_capacity(self, rig: str, model: str, ctx: Context | None = None) -> dict[str, Any]:
        self.check_rig(rig)
        entry = self.catalog()[self.check_model(model)]
        facts = await self.read_capacity(rig, ctx)
        if "disk_free_bytes" not in facts:
            raise ToolError(f"capacity.yml showed no figures for {rig}")
        found = self.weigh(rig, entry, facts)
        return {"rig": rig, "model": model, **capacity.verdict(rig, model, found), "facts": facts}

    async def read_capacity(self, rig: str, ctx: Context | None) -> dict[str, Any]:
        """What capacity.yml read on the rig ({} when it showed nothing)."""
        run = await self.play(ctx, "playbooks/capacity.yml", rig)
        facts = (run.result("Show the capacity", rig) or {}).get("msg") or {}
        return facts if isinstance(facts, dict) else {}

    def weigh(self, rig: str, entry: dict[str, Any], facts: dict[str, Any]) -> list[capacity.Term]:
        """The capacity terms of the catalog ``entry`` on ``rig``, with the flags its unit gets."""
        utilization, kv_bytes = capacity.vllm_memory_flags(self.hostvars(rig))
        return capacity.terms(facts, int(entry.get("size_bytes") or 0), utilization, kv_bytes)

    async def service(self, verb: str, rig: str, ctx: Context | None = None) -> dict[str, Any]:
        self.check_rig(rig)
        with self.mutating([rig], f"{verb} of {rig}"):
            if verb in ("start", "restart"):
                await self.refuse_start_when_short(verb, rig, ctx)
            await self.play(ctx, f"playbooks/{verb}.yml", rig)
        return {"rig": rig, "done": verb}

    async def refuse_start_when_short(self, verb: str, rig: str, ctx: Context | None) -> None:
        """ToolError when the rig's memory cannot hold the build tpu.env names (the disk already does)."""
        facts = await self.read_capacity(rig, ctx)
        key = facts.get("served_key") or ""
        entry = self.catalog().get(key)
        if not entry:
            return  # no tpu.env yet, or a build outside the catalog: the unit's own checks decide
        fit = capacity.verdict(rig, key, [t for t in self.weigh(rig, entry, facts) if t.name != "disk"])
        if not fit["fits"]:
            raise ToolError(f"{verb} refused: {fit['summary']}")

    async def swap(self, model: str, rigs: list[str], ctx: Context | None = None) -> dict[str, Any]:
        self.check_model(model)
        if not rigs:
            raise ToolError("rigs is empty: name at least one rig (see list_rigs)")
        for rig in rigs:
            self.check_rig(rig)
        with self.mutating(rigs, f"swap of {', '.join(rigs)} to {model}"):
            # Refused before anything is staged when the build does not fit a rig.
            for rig in rigs:
                fit = await self.check_capacity(rig, model, ctx)
                if not fit["fits"]:
                    raise ToolError(f"swap refused: {fit['summary']}")
            # swap.yml's first play checks the model and builds it on the controller (hosts:
            # localhost): a limit of the rigs alone would skip it.
            run = await self.play(ctx, "playbooks/swap.yml", ",".join([*rigs, "localhost"]), {"model": model})
        said = [
            r["res"].get("msg")
            for r in run.results
            if r["task"].startswith(("Report", "Say")) and isinstance(r["res"].get("msg"), str)
        ]
        return self.redact({"model": model, "rigs": rigs, "messages": said})

    async def bench(self, rig: str, quick: bool, ctx: Context | None = None) -> dict[str, Any]:
        self.check_rig(rig)
        extravars: dict[str, Any] = dict(QUICK_GRID) if quick else {}
        if self.config.runs_dir is not None:
            extravars |= {"bench_runs_dir": str(self.config.runs_dir), "bench_update_index": False}
        with self.mutating([rig], f"bench of {rig}"):
            run = await self.play(ctx, "playbooks/bench.yml", rig, extravars)
        report = Path((run.result("Show where the report is", rig) or {}).get("msg", ""))
        if not report.is_file():
            raise ToolError(f"bench.yml named no report for {rig} (looked for {report})")
        return {
            "rig": rig,
            "quick": quick,
            "run_dir": str(report.parent),
            "report": str(report),
            "summary": summary_table(report.read_text()),
        }

    async def cost(self, ctx: Context | None = None) -> dict[str, Any]:
        """playbooks/cost.yml's report: every rig's and the fleet's figures, as the playbook made them."""
        run = await self.play(ctx, "playbooks/cost.yml", "all,localhost")
        doc = (run.result("Report the fleet's cost", "localhost") or {}).get("msg")
        if not isinstance(doc, dict) or not isinstance(doc.get("fleet"), dict):
            raise ToolError("cost.yml showed no fleet report")
        return self.redact(doc)


def clamp_state(rc: int | None, words: str) -> str:
    """The clamp check's outcome as one word: present once, absent, doubled, or unknown."""
    if rc == 0:
        return "present once"
    if "missing" in words:
        return "absent"
    if re.search(r"present \d+ times", words):
        return "doubled"
    return "unknown"


def summary_table(report: str) -> str:
    """The first Markdown table of a REPORT.md."""
    lines = report.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return ""
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


TOOLS: dict[str, str] = {
    "list_rigs": "The rigs in the inventory: name, platform, host, port, the model the inventory names.",
    "list_models": "The model catalog: key, description, build kind and target, size in bytes.",
    "status": "One rig's status, as rigctl works it out: service, health, model, KV cache, clamp, memory.",
    "start": "Start vLLM on a rig and wait until the model answers (playbooks/start.yml).",
    "stop": "Stop vLLM on a rig (playbooks/stop.yml).",
    "restart": "Restart vLLM on a rig and wait until the model answers (playbooks/restart.yml).",
    "query": "Ask the model a rig serves now; flags a reply that is reasoning only (no answer).",
    "swap": "Change the served model on the given rigs, one at a time, rolled back on failure (swap.yml).",
    "logs": "The last lines of vLLM's journal on a rig.",
    "check_capacity": "Whether a catalog build fits a rig: disk, memory, accelerator memory; names the binding term.",
    "verify_clamp": "The Turing clamp on a rig: present once, absent, doubled, or not used on this platform.",
    "bench": "Benchmark a rig (quick: one cell) and record the run; returns the summary table and the run's path.",
    "cost": "What each cloud rig and the fleet cost this month: rates, hours run, month to date, projection (cost.yml).",
    "metrics": "Each rig's last N minutes from Prometheus: requests/s, tokens/s, TTFT p50/p95, queue, KV cache, errors.",
}


def one_line(text: str, limit: int = 500) -> str:
    """``text`` on one line (its lines joined with '; '), at most ``limit`` characters."""
    joined = "; ".join(line.strip() for line in str(text).splitlines() if line.strip())
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def failed(srv: RigServer, name: str, line: str) -> CallToolResult:
    """The tool's error result: the one line itself. A raised ToolError would reach the client
    behind the SDK's "Error executing tool NAME:"; a CallToolResult with is_error passes as it is."""
    text = srv.redact(one_line(line) or f"{name} failed with no message")
    log.info("tool %s failed: %r", name, text)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


class RigMCPServer(MCPServer):
    """The SDK's server, but arguments that do not fit a tool's schema come back as one line that
    names the fields and what is wrong with each (never the values: they are the caller's data),
    without the SDK's "Error executing tool NAME:" and pydantic's multi-line report."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            problems = "; ".join(
                f"{'.'.join(str(part) for part in err['loc']) or 'arguments'}: {err['msg']}"
                for err in exc.__cause__.errors()
            )
            text = one_line(f"{name}: bad arguments: {problems}")
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def guarded(srv: RigServer, name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``fn``, with every failure one line naming the cause and the fix, as the client's error
    result: never the SDK's generic "Error executing tool" (which hides the cause in the log)."""

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except (ToolError, PlaybookFailed, Busy, UnsafeLockDir) as exc:
            return failed(srv, name, str(exc))
        except Exception as exc:  # the boundary: whatever broke, one clear line
            return failed(
                srv, name, f"{name} failed: {type(exc).__name__}: {one_line(str(exc)) or 'no message'}"
            )

    return tool


def build(config: Config, runner: PlaybookRunner | None = None, token: str | None = None) -> MCPServer:
    """The MCP server with its tools (only the read-only ones under ``config.read_only``); with
    ``token``, its HTTP transport refuses any request without that bearer token."""
    srv = RigServer(config, runner)
    auth: dict[str, Any] = {}
    if token:
        auth = {
            # The SDK's resource-server mode: no OAuth flow, the verifier alone decides.
            "auth": AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None),
            "token_verifier": StaticToken(token),
        }
    mcp = RigMCPServer(
        SERVER_NAME, instructions="Operate the gemma-rig inventory: vLLM rigs serving Gemma 4.", **auth
    )
    ro = ToolAnnotations(read_only_hint=True, destructive_hint=False)
    rw = ToolAnnotations(read_only_hint=False, destructive_hint=False)

    def add(fn: Callable[..., Any], name: str) -> None:
        if config.read_only and name in MUTATING:
            return
        mcp.add_tool(
            guarded(srv, name, fn),
            name=name,
            description=TOOLS[name],
            annotations=rw if name in MUTATING else ro,
        )

    async def list_rigs() -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(srv.list_rigs)

    async def list_models() -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(srv.list_models)

    async def status(rig: RigName, ctx: Context) -> dict[str, Any]:
        return await srv.status(rig, ctx)

    async def start(rig: RigName, ctx: Context) -> dict[str, Any]:
        return await srv.service("start", rig, ctx)

    async def stop(rig: RigName, ctx: Context) -> dict[str, Any]:
        return await srv.service("stop", rig, ctx)

    async def restart(rig: RigName, ctx: Context) -> dict[str, Any]:
        return await srv.service("restart", rig, ctx)

    async def query(
        prompt: Annotated[str, Field(description="The user message.", min_length=1)],
        ctx: Context,
        rig: Annotated[
            str | None, Field(description="A rig's name; default: the inventory's first rig.")
        ] = None,
        max_tokens: Annotated[
            int, Field(description="Completion budget (Gemma 4 reasons first).", ge=1, le=32768)
        ] = 512,
        tools: Annotated[
            list[dict[str, Any]] | None,
            Field(description="OpenAI tool objects to offer; a call the model makes is reported, never run."),
        ] = None,
        response_format: Annotated[
            dict[str, Any] | None,
            Field(description="An OpenAI response_format (json_schema) for the answer."),
        ] = None,
    ) -> dict[str, Any]:
        agent = {k: v for k, v in (("tools", tools), ("response_format", response_format)) if v is not None}
        return await srv.query(prompt, rig, max_tokens, ctx, agent)

    async def swap(
        model: ModelKey,
        rigs: Annotated[list[str], Field(description="Rig names, swapped one at a time.", min_length=1)],
        ctx: Context,
    ) -> dict[str, Any]:
        return await srv.swap(model, rigs, ctx)

    async def logs(
        rig: RigName,
        ctx: Context,
        # The bounds are in the schema; the tool checks them itself, so a bad count gets one clear line.
        lines: Annotated[
            int,
            Field(
                description="How many journal lines.",
                json_schema_extra={"minimum": 0, "maximum": MAX_LOG_LINES},
            ),
        ] = 50,
    ) -> dict[str, Any]:
        return await srv.logs(rig, lines, ctx)

    async def check_capacity(rig: RigName, model: ModelKey, ctx: Context) -> dict[str, Any]:
        return await srv.check_capacity(rig, model, ctx)

    async def verify_clamp(rig: RigName, ctx: Context) -> dict[str, Any]:
        return await srv.verify_clamp(rig, ctx)

    async def bench(
        rig: RigName,
        ctx: Context,
        quick: Annotated[bool, Field(description="One small cell instead of the full grid.")] = True,
    ) -> dict[str, Any]:
        return await srv.bench(rig, quick, ctx)

    async def cost(ctx: Context) -> dict[str, Any]:
        return await srv.cost(ctx)

    async def metrics(
        ctx: Context,
        minutes: Annotated[
            int, Field(description="The window, in minutes.", ge=1, le=METRICS_MINUTES_MAX, strict=True)
        ] = 15,
    ) -> dict[str, Any]:
        return await srv.metrics(minutes, ctx)

    for fn, name in (
        (list_rigs, "list_rigs"),
        (list_models, "list_models"),
        (status, "status"),
        (start, "start"),
        (stop, "stop"),
        (restart, "restart"),
        (query, "query"),
        (swap, "swap"),
        (logs, "logs"),
        (check_capacity, "check_capacity"),
        (verify_clamp, "verify_clamp"),
        (bench, "bench"),
        (cost, "cost"),
        (metrics, "metrics"),
    ):
        add(fn, name)
    return mcp


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rig_mcp", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "-i", "--inventory", action="append", help=f"inventory file(s) (default: {DEFAULT_INVENTORY})"
    )
    p.add_argument("--read-only", action="store_true", help="expose only the tools that change nothing")
    p.add_argument(
        "--lock-dir",
        type=Path,
        help="per-rig lock files, a directory of this user's alone "
        "(default: $XDG_RUNTIME_DIR/gemma-rig-mcp, else ~/.cache/gemma-rig/mcp-locks)",
    )
    p.add_argument("--runs-dir", type=Path, help="where bench records go (default: evidence/runs)")
    p.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default: %(default)s)")
    p.add_argument("--port", type=int, default=8765, help="HTTP port (default: %(default)s)")
    p.add_argument(
        "--token-file",
        type=Path,
        help=f"HTTP bearer token, in a 0600 file of this user's (or env {TOKEN_ENV}); always required; "
        "a FILE that does not exist is made 0600 with a random token",
    )
    # The token is always required now. The flag stays accepted (and does nothing) so a unit file
    # or script written for the old opt-in keeps starting, with the behaviour it asked for.
    p.add_argument("--require-token", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (PEM; with --tls-key)")
    p.add_argument("--tls-key", type=Path, help="the certificate's private key (PEM, mode 0600)")
    p.add_argument(
        "--tls",
        choices=["self-signed"],
        help="serve HTTPS with a certificate the server makes and keeps in ~/.cache/gemma-rig/mcp-tls "
        "(EC P-256; named for the bind address, localhost and --allowed-host); without it or "
        "--tls-cert, a --host off loopback is refused",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="another Host header value to accept (HOST:PORT or HOST:*); default: the bind address and localhost",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        help="another Origin header value to accept (e.g. https://example.org); default: http:// of the above",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    config = Config(
        args.inventory or [DEFAULT_INVENTORY],
        args.read_only,
        args.lock_dir or default_lock_dir(),
        args.runs_dir,
    )
    token, made, tls = None, "", None
    try:
        if args.http:
            # TLS first: a start refused for want of TLS leaves no token file made behind it unsaid.
            tls = http_tls(args.host, args.port, args.tls_cert, args.tls_key, args.tls, args.allowed_host)
            token, made = http_token(args.token_file, os.environ)
        if not config.read_only:
            private_dir(config.lock_dir)  # refused at start, not on the first mutating call
    except (StartRefused, UnsafeLockDir) as exc:
        say(str(exc))
        return 2
    server = build(config, token=token)
    if not args.http:
        server.run("stdio")
        return 0
    if made:
        say(made)
    if tls is not None:
        say(tls.line())
    where = f"[{args.host}]" if ":" in args.host else args.host
    say(f"serving {'https' if tls else 'http'}://{where}:{args.port}/mcp (bearer token required)")
    security = http_security(args.host, args.allowed_host, args.allowed_origin, tls=tls is not None)
    anyio.run(serve, server, args.host, args.port, security, tls)
    return 0


__all__ = [
    "ROOT",
    "TOKEN_ENV",
    "Config",
    "RigServer",
    "StartRefused",
    "build",
    "http_security",
    "is_loopback",
    "main",
    "read_token_file",
]
