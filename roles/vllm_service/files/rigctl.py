#!/usr/bin/python3 -I
"""rigctl: the rig's own command and the one place that works its state out: status, start, stop,
restart, the wait until vLLM answers, logs, query and the start-time code checks. The ops playbooks
and the vllm_service role run it (`--json`) and word what it reports; docs/mcp.md gives the JSON
schema. query.yml runs this same file on the controller to ask a gateway (`query --url`).

Installed on every rig by the vllm_service role (/usr/local/bin/rigctl), which writes SETTINGS
below from the inventory's names. Standard library only. The port and the API key come from tpu.env
(RIG_PORT, VLLM_API_KEY); the key is sent as a bearer token and never printed. A prompt that no
argument could carry (NUL bytes, any size) and a gateway's key come as one JSON object on stdin.

Exit codes (every subcommand):
  0  done / serving / every code check passed
  1  the action failed (a start or wait that did not come up, a query that failed, a code check
     failed, journalctl failed)
  2  usage error (bad arguments)
  3  status only: the service is not serving (stopped, failed or not healthy)
  4  tpu.env or the unit cannot be read (not installed, or run without root)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_SERVING, EXIT_NO_CONFIG = 0, 1, 2, 3, 4
SCHEMA = 1  # the "rigctl" field of every --json object; raised when a field changes meaning
# The rig's names (inventory/group_vars/all/rig.yml), written here by the vllm_service role as it
# installs rigctl: unit, env_file, helper_dir (the code checks), python (vLLM's), swap_state_dir.
SETTINGS: dict[str, str] = {}
START_LIMIT_REMEDY = "fix the cause, then playbooks/start.yml"
# The start-time checks of the code the rig patches, each run where the role installed it in the
# helper folder: the Turing clamp (T4 and local), the tpu-inference patch (TPU).
CODE_CHECKS = (("clamp", "clamp-check"), ("tpu-inference patch", "tpu_inference_patch.py"))
# A chat this short proves the sampler runs (the CPU build compiles it on first use).
READY_CHAT = {"prompt": "Say OK.", "max_tokens": 8}
# Seconds between probes of a starting vLLM: a refused connection costs nothing, and the wait ends
# this soon after vLLM answers.
POLL = 0.5
# systemd's SubState between a failed run of the unit and its automatic restart (252: auto-restart;
# later versions also auto-restart-queued).
AUTO_RESTART = "auto-restart"


class RigctlError(Exception):
    """A failure with its exit code and a one-line message."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def setting(name: str) -> str:
    if not SETTINGS.get(name):
        raise RigctlError(f"rigctl has no {name} setting: install it with site.yml", EXIT_NO_CONFIG)
    return SETTINGS[name]


def run(cmd: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a command (never through a shell) and capture its output."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RigctlError(f"cannot run {cmd[0]}: {exc}") from exc


def unit_props(unit: str) -> dict[str, str]:
    """`systemctl show UNIT` as a dict."""
    res = run(["systemctl", "show", unit, "--no-pager"])
    if res.returncode != 0:
        raise RigctlError(
            f"systemctl show {unit} failed: {(res.stderr or res.stdout).strip()}", EXIT_NO_CONFIG
        )
    props = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    if props.get("LoadState") == "not-found":
        raise RigctlError(f"{unit}.service is not installed on this host", EXIT_NO_CONFIG)
    return props


def read_env(path: str) -> dict[str, str]:
    """KEY=VALUE lines of a systemd EnvironmentFile (comments, double-quoted values)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except PermissionError as exc:
        raise RigctlError(
            f"cannot read {path}: permission denied (run rigctl as root)", EXIT_NO_CONFIG
        ) from exc
    except OSError as exc:
        raise RigctlError(f"cannot read {path}: {exc.strerror}", EXIT_NO_CONFIG) from exc
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        env[key.strip()] = value
    return env


class Endpoint:
    """An OpenAI-compatible endpoint: the rig's own (tpu.env), or a gateway's (--url)."""

    def __init__(self, url: str, key: str = "", ca_file: str | None = None) -> None:
        self.url, self.key = url.rstrip("/"), key
        try:
            self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        except OSError as exc:
            raise RigctlError(f"cannot use the CA file {ca_file}: {exc}") from None
        self.answered_by: str | None = None  # HAProxy's x-gemma-rig header: the rig behind a gateway
        self.error = ""  # why nothing answered

    def _request(self, path: str, body: dict | None = None) -> urllib.request.Request:
        """``path`` on this endpoint with its key, and ``body`` as JSON when given."""
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        data = json.dumps(body).encode() if body is not None else None
        if data:
            headers["Content-Type"] = "application/json"
        return urllib.request.Request(self.url + path, data=data, headers=headers)

    def text(self, path: str, limit: int, timeout: float = 10) -> str:
        """GET ``path``'s body as text, at most ``limit`` bytes; RigctlError when it cannot be read."""
        try:
            with urllib.request.urlopen(
                self._request(path), timeout=timeout, context=self.context
            ) as response:
                return response.read(limit).decode("utf-8", "replace")
        # http.client's own errors (a status line that is not HTTP, a body cut short) are not
        # OSErrors: without them here, whatever else holds the port would crash the idle timer.
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            # One line of printable text: what answered on the port is outside data.
            why = re.sub(r"[\x00-\x1f\x7f-\x9f]+", " ", str(getattr(exc, "reason", exc))).strip()[:200]
            raise RigctlError(f"{path} unreadable: {why}") from None

    def http(self, path: str, body: dict | None = None, timeout: float = 5) -> tuple[int, object]:
        """(status, decoded JSON or None); status -1 when nothing answers."""
        try:
            with urllib.request.urlopen(
                self._request(path, body), timeout=timeout, context=self.context
            ) as response:
                raw, status = response.read(), response.status
                self.answered_by = response.headers.get("x-gemma-rig")
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (urllib.error.URLError, OSError) as exc:
            self.error = str(getattr(exc, "reason", exc))
            return -1, None
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    def served(self) -> tuple[int, list[str]]:
        """(status of /v1/models, the model ids it lists: the build first, then its alias)."""
        status, doc = self.http("/v1/models")
        data = doc.get("data") if isinstance(doc, dict) else None
        return status, [str(m.get("id", "")) for m in data or [] if isinstance(m, dict)]

    def ask(
        self, model: str, prompt: str, max_tokens: int, timeout: float, agent: dict | None = None
    ) -> dict:
        """One user message to ``model``, with ``agent``'s tools and response_format when given: the
        answer (naming a reply that is reasoning only), the tool calls the model made (not run
        here), and in words."""
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                **(agent or {})}  # fmt: skip
        status, doc = self.http("/v1/chat/completions", body, timeout=timeout)
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if status != 200 or not choices or not isinstance(choices[0], dict):
            why = f"nothing answered: {self.error}" if status == -1 else f"status {status}"
            raise RigctlError(
                f"{model} is listed on {self.url}/v1/models but a chat completion failed ({why})"
            )
        message = choices[0].get("message") or {}
        answer = str(message.get("content") or "").strip()
        reasoning = str(message.get("reasoning_content") or message.get("reasoning") or "")
        usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
        calls = tool_calls(message)
        out = {"model": doc.get("model"), "answer": answer,
               "reasoning_only": not answer and not calls and bool(reasoning),
               "reasoning_chars": len(reasoning), "tool_calls": calls, "finish_reason": choices[0].get("finish_reason"),
               "usage": usage, "answered_by": self.answered_by}  # fmt: skip
        lines = [f"{out['model']}: {answer}"]
        # A name or arguments the model wrote are data: JSON-quoted, no control character reaches a terminal.
        lines += [f"tool call (not run): {json.dumps(c['name'])} {json.dumps(c['arguments'])}" for c in calls]
        if out["reasoning_only"]:
            lines.append(
                f"(reasoning only: no answer within max_tokens={max_tokens}, finish_reason {out['finish_reason']})"
            )
        lines.append(f"tokens: {usage.get('prompt_tokens')} in, {usage.get('completion_tokens')} out")
        return {**out, "lines": lines}


def tool_calls(message: dict) -> list[dict[str, str]]:
    """The function calls an answer holds ({id, name, arguments}: arguments as the model's JSON text)."""
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    functions = [(c, c.get("function")) for c in calls or [] if isinstance(c, dict)]
    return [{"id": str(c.get("id") or ""), "name": str(f.get("name") or ""), "arguments": str(f.get("arguments") or "")}
            for c, f in functions if isinstance(f, dict)]  # fmt: skip


def rig_endpoint() -> tuple[str, dict[str, str], Endpoint]:
    """tpu.env (its path and its values) and the endpoint it names on this host."""
    env_file = setting("env_file")
    env = read_env(env_file)
    if "RIG_PORT" not in env:
        raise RigctlError(f"{env_file} has no RIG_PORT", EXIT_NO_CONFIG)
    return env_file, env, Endpoint(f"http://127.0.0.1:{env['RIG_PORT']}", env.get("VLLM_API_KEY", ""))


class Rig:
    """The local service: its unit, its tpu.env and its endpoint."""

    def __init__(self, unit: str) -> None:
        if not unit:
            raise RigctlError("rigctl has no unit setting: install it with site.yml", EXIT_NO_CONFIG)
        self.unit = unit
        self.props = unit_props(unit)
        self.env_file, self.env, self.api = rig_endpoint()
        self.url = self.api.url

    def refresh(self) -> None:
        """Read the unit's properties again (after a start or stop)."""
        self.props = unit_props(self.unit)


def code_checks() -> list[dict]:
    """Each code check installed in the helper folder, run against vLLM's python: name, ok, its
    own words. None installed fails: nothing would stop an unpatched start."""
    folder, python = setting("helper_dir"), setting("python")
    found = []
    for name, file in CODE_CHECKS:
        path = os.path.join(folder, file)
        if os.path.isfile(path):
            res = run([python, "-I", path, "check", "--python", python])
            found.append(
                {"name": name, "ok": res.returncode == 0, "words": (res.stdout + res.stderr).strip()}
            )
    return found


def check_lines(checks: list[dict]) -> list[str]:
    """The code checks in words, one line each (status and clamp alike)."""
    if not checks:
        return [f"clamp: MISSING: no clamp or tpu-inference patch check in {setting('helper_dir')}"]
    names = [c["name"] for c in checks]
    lines = [] if "clamp" in names else ["clamp: not used on this platform"]
    for c in checks:
        if c["name"] == "clamp":
            lines.append(f"clamp: {'present once' if c['ok'] else 'MISSING OR DUPLICATED: ' + c['words']}")
        else:
            lines.append(f"{c['name']}: {'present' if c['ok'] else 'MISSING: ' + c['words']}")
    return lines


def journal(*args: str) -> str:
    res = run(["journalctl", "--no-pager", *args])
    return res.stdout if res.returncode == 0 else ""


def status(rig: Rig, expect_model: str = "") -> dict:
    """The rig's state (the --json object's fields) and the same in words ("lines")."""
    p = rig.props
    active, sub = p.get("ActiveState", "?"), p.get("SubState", "?")
    since = p.get("ActiveEnterTimestamp") or None
    restarts = int(p.get("NRestarts") or 0)
    gave_up, reason = False, None
    lines = [f"service: {active}/{sub} since {since or '-'}"]
    if active == "failed":
        failed_log = journal("-u", rig.unit, "-n", "60", "-o", "short-iso")
        gave_up = p.get("Result") == "start-limit-hit" or "Start request repeated too quickly" in failed_log
        # The last line not from systemd itself: what the failing command said.
        own = [line for line in failed_log.splitlines() if not re.search(r" systemd\[1\]: ", line)]
        reason = re.sub(r"^\S+ \S+ [^:]+: ", "", own[-1]) if own else "no log line"
        head = (
            f"gave up after repeated failed starts (start limit hit; no more automatic restarts: {START_LIMIT_REMEDY})"
            if gave_up
            else f"failed ({p.get('Result', '?')})"
        )
        lines.append(f"{head}: {reason}")
    else:
        lines.append(f"restarts: {restarts}")
    swap = swap_journal()
    lines.append(
        f"last swap: {swap['from']} -> {swap['to']}, {swap['phase']}"
        if swap
        else "last swap: none journalled"
    )
    health, _ = rig.api.http("/health")
    lines.append(f"health: {'ok' if health == 200 else f'down ({health})'}")
    models_status, served = rig.api.served()
    if served:
        model = served[0] + (f" (also answers to {', '.join(served[1:])})" if len(served) > 1 else "")
        if expect_model and expect_model not in served:
            model += f" (the inventory says {expect_model}: swapped since site.yml)"
    elif models_status == 401:
        model = "refused our key (401): rig_api_key differs from the VLLM_API_KEY in tpu.env"
    else:
        model = "none answering"
    lines.append(f"model: {model}")
    invocation = p.get("InvocationID", "")
    log = journal("-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}") if invocation else ""
    kv = re.findall(r"KV cache size: ([0-9,]+) tokens", log)
    lines.append(f"KV cache tokens: {kv[-1] if kv else 'not logged yet'}")
    checks = code_checks()
    lines.extend(check_lines(checks))
    idle_state = idle_load()
    idle = idle_report(idle_state)
    lines.extend([f"idle stop: {idle['line']}"] if idle_state else [])
    host = host_lines()
    serving = active == "active" and health == 200
    return {
        "ok": serving,
        "serving": serving,
        "service": {"active": active, "sub": sub, "since": since, "result": p.get("Result"),
                    "restarts": restarts, "gave_up": gave_up, "reason": reason},
        "last_swap": swap,
        "health": health,
        "models_status": models_status,
        "build": served[0] if served else None,
        "aliases": served[1:],
        "kv_cache_tokens": int(kv[-1].replace(",", "")) if kv else None,
        "checks": checks,
        "idle": idle,
        "host": host,
        "lines": lines + host,
    }  # fmt: skip


def host_lines() -> list[str]:
    """Accelerator (or CPU) memory, swap and uptime."""
    out: list[str] = []
    query = ["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"]
    smi = run(query) if shutil.which("nvidia-smi") else None
    free = run(["free", "-h"]).stdout.splitlines()
    row = {line.split(":")[0]: line.split()[1:] for line in free if ":" in line}
    if smi is not None and smi.returncode == 0:
        out.extend(smi.stdout.strip().splitlines())
    elif "Mem" in row:
        out.append(f"cpu: {row['Mem'][1]} used of {row['Mem'][0]}")
    if "Swap" in row:
        out.append(f"swap: {row['Swap'][1]} used of {row['Swap'][0]}")
    out.append(f"uptime: {run(['uptime', '-p']).stdout.strip()}")
    return out


def wait_ready(rig: Rig, args: argparse.Namespace, restarts_before: int, chat: dict | None) -> dict:
    """Wait until /v1/models lists the name tpu.env serves (swap.yml changes it, not the
    inventory), or --model, then send ``chat`` ({prompt, max_tokens}) unless None; fail at once
    when vLLM exits instead (a unit waiting to restart it, a new automatic restart, or a unit that
    failed or stopped)."""
    rig.env = read_env(rig.env_file)
    name = getattr(args, "model", None) or rig.env.get("RIG_SERVED_MODEL_NAME", "")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        rig.refresh()
        restarts = int(rig.props.get("NRestarts") or 0)
        # systemd counts a restart when it makes it, RestartSec after vLLM exited; in between the
        # unit is `activating (auto-restart)`, and that exit is already the answer.
        waiting = rig.props.get("SubState", "").startswith(AUTO_RESTART)
        if waiting or restarts > restarts_before or rig.props.get("ActiveState") in ("failed", "inactive"):
            tail = journal("-u", rig.unit, "-n", "25", "-o", "cat").rstrip()
            state = f"{rig.props.get('ActiveState')}" + (f" ({rig.props['SubState']})" if waiting else "")
            raise RigctlError(
                f"vLLM exited while starting (automatic restarts: {restarts}, unit: {state}); "
                f"its last lines:\n{tail}"
            )
        status, served = rig.api.served()
        if status == 200 and served and (not name or name in served):
            said = chat and rig.api.ask(served[0], chat["prompt"], chat["max_tokens"], args.chat_timeout)
            return {"build": served[0], "url": rig.url, "chat": said,
                    "lines": [f"{rig.unit}: serving {served[0]} on {rig.url}"]}  # fmt: skip
        time.sleep(POLL)
    raise RigctlError(
        f"{rig.unit} did not list {name or 'a model'} on /v1/models within {args.timeout:.0f} s"
    )


def read_request(max_tokens: int) -> dict:
    """--request-stdin's JSON object {prompt[, max_tokens][, api_key][, tools][, response_format]}:
    a prompt or a key never needs to be an argument. tools (a list of objects) and response_format
    (an object) go to the chat completion as they came, for vLLM to check."""
    try:
        request = json.loads(sys.stdin.read())
    except ValueError as exc:
        raise RigctlError(f"--request-stdin: not one JSON object: {exc}", EXIT_USAGE) from None
    if not isinstance(request, dict) or not isinstance(request.get("prompt"), str):
        raise RigctlError('--request-stdin: want {"prompt": TEXT, "max_tokens": N}', EXIT_USAGE)
    max_tokens = request.get("max_tokens", max_tokens)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise RigctlError(f"--request-stdin: max_tokens must be 0 or more, got {max_tokens!r}", EXIT_USAGE)
    tools, response_format = request.get("tools"), request.get("response_format")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RigctlError("--request-stdin: tools must be a list of objects", EXIT_USAGE)
    if response_format is not None and not isinstance(response_format, dict):
        raise RigctlError("--request-stdin: response_format must be an object", EXIT_USAGE)
    agent = {"tools": tools, "response_format": response_format}
    return {
        "prompt": request["prompt"],
        "max_tokens": max_tokens,
        "api_key": str(request.get("api_key") or ""),
        "agent": {k: v for k, v in agent.items() if v is not None},
    }


# Idle auto-stop (docs/idle.md). vLLM's own Prometheus names (its v1/metrics/loggers.py): work in
# hand, and counters that move with every request it serves. A health check or a /metrics read moves
# none of them.
IDLE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
IDLE_COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
# A metric line: name, labels (quoted values may hold spaces, braces, escaped quotes), value.
_METRIC_LINE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)(\s+-?\d+)?\s*'
)
METRICS_MAX_BYTES = 8 << 20
# Swap phases in which a swap is still working on the rig (swap_journal.py's PHASES).
SWAP_BUSY = ("staging", "switching", "trial")
IDLE_STATE = "idle.json"
IDLE_TAG = "gemma-rig-idle"  # the journal tag of the timer's decisions
# Seconds a start may take before time in which vLLM cannot serve counts toward the idle stop: the
# role passes the unit's own start deadline (vllm_service_start_timeout); this is its default.
IDLE_START_ALLOWANCE = 900


def read_metrics(text: str) -> dict[str, float]:
    """The idle metrics on a /metrics page, each summed over its label sets. The page is outside
    data: a name that is missing, or a value that is not a finite number of 0 or more, is an error
    (RigctlError) and never a guess."""
    wanted = (*IDLE_GAUGES, *IDLE_COUNTERS)
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC_LINE.fullmatch(line)
        if not match or match.group(1) not in wanted:
            continue
        name, raw = match.group(1), match.group(3)
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not (0 <= value < float("inf")):
            raise RigctlError(f"/metrics: {name} is not a count: {raw[:40]!r}")
        sums[name] = sums.get(name, 0.0) + value
    missing = [n for n in wanted if n not in sums]
    if missing:
        raise RigctlError(f"/metrics lacks {', '.join(missing)}")
    return sums


def swap_journal() -> dict | None:
    """The swap journal's from, to and phase, or None (none journalled, or unreadable)."""
    try:
        with open(os.path.join(setting("swap_state_dir"), "swap.json"), encoding="utf-8") as fh:
            swap = json.load(fh)
    except (OSError, ValueError):
        return None
    return {k: swap.get(k) for k in ("from", "to", "phase")} if isinstance(swap, dict) else None


def bench_running(proc: str = "/proc") -> bool:
    """Whether bench.yml's client runs here (bench.py in its gemma-rig-bench.* working folder)."""
    for pid in os.listdir(proc) if os.path.isdir(proc) else []:
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as fh:
                argv = fh.read(65536).split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/bench.py") and b"/gemma-rig-bench." in a for a in argv):
            return True
    return False


def this_boot(proc: str = "/proc") -> str:
    """This boot of the machine or of the rig's container: the kernel's boot id and PID 1's start
    time (field 22 of /proc/1/stat, clock ticks since the kernel booted). The local rig is a
    container on the host's kernel, so its stop and start keep the boot id; its new PID 1 starts
    later. "" when unreadable: then no not-serving count carries over from one check to the next."""
    try:
        with open(os.path.join(proc, "sys/kernel/random/boot_id"), encoding="ascii") as fh:
            boot = fh.read().strip()
        with open(os.path.join(proc, "1/stat"), encoding="utf-8", errors="replace") as fh:
            # The command name (field 2, in parentheses) may hold spaces and parentheses itself.
            start = fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, ValueError, IndexError):
        return ""
    return f"{boot}/{start}" if boot and start.isdigit() else ""


def timer_run(unit: str) -> str:
    """When the idle timer (UNIT-idle.timer, the role's name) last started, on the monotonic clock,
    or "" (not installed, unreadable). A person who stops it to repair a rig and starts it again (or
    site.yml does) gets a whole start allowance, not the count from before the pause."""
    try:
        return unit_props(f"{unit}-idle.timer").get("ActiveEnterTimestampMonotonic", "")
    except RigctlError:
        return ""


def idle_observe(rig: Rig) -> dict:
    """What the idle decision reads now: the unit's state and invocation, what blocks an idle stop,
    vLLM's counters (None when blocked before they could be read), this boot and run of the idle
    timer (``boot``), and ``not_serving``: why vLLM cannot serve (the unit not active, or /metrics
    not answering), else None. A page that answers but cannot be read as numbers is a block, not a
    vLLM that cannot serve."""
    boot = this_boot()
    seen = {"invocation": rig.props.get("InvocationID", ""), "blocks": [], "counters": None,
            "not_serving": None, "boot": boot and f"{boot}/{timer_run(rig.unit)}"}  # fmt: skip
    state = rig.props.get("ActiveState", "?")
    if state != "active":
        seen["not_serving"] = f"{rig.unit} is {state}"
    else:
        try:
            page = rig.api.text("/metrics", METRICS_MAX_BYTES)  # it needs the key like /v1 does
        except RigctlError as exc:  # refused, an HTTP error, a timeout: nothing serves there
            seen["not_serving"] = str(exc)
        else:
            try:
                sums = read_metrics(page)
            except RigctlError as exc:
                seen["blocks"].append(str(exc))
            else:
                seen["counters"] = [sums[n] for n in IDLE_COUNTERS]
                seen["blocks"] += [
                    f"requests {n.rsplit('_', 1)[1]}: {sums[n]:g}" for n in IDLE_GAUGES if sums[n] > 0
                ]
    # Not serving blocks the served-nothing count as any other block does; it has a count of its own.
    seen["blocks"] += [seen["not_serving"]] if seen["not_serving"] else []
    swap = swap_journal()
    if swap and swap["phase"] in SWAP_BUSY:
        seen["blocks"].append(f"a swap is in progress ({swap['phase']})")
    if bench_running():
        seen["blocks"].append("a bench is running")
    return seen


def _a_time(value: object, now: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value <= now


def idle_decide(
    before: dict | None, seen: dict, now: float, threshold: int | None, allowance: int = IDLE_START_ALLOWANCE
) -> dict:
    """The next idle state: idle since the first check that found the same vLLM (invocation), the
    same counters and nothing blocking; anything else starts the count again. Not serving since the
    first check of this boot that found vLLM unable to serve and nothing else blocking, every check
    since alike: a rig a wake started that never serves stops too, ``allowance`` seconds (its start)
    later than an idle one. ``stop`` when a threshold (minutes) is given and either is reached."""
    same = (
        isinstance(before, dict)
        and not seen["blocks"]
        and before.get("invocation") == seen["invocation"]
        and before.get("counters") == seen["counters"]
        and isinstance(before.get("idle_since"), (int, float))
        and before["idle_since"] <= now
    )
    since = before["idle_since"] if same else now
    minutes = round((now - since) / 60, 2)
    stop = bool(threshold) and not seen["blocks"] and minutes >= threshold
    # Not serving is counted only while it is all that blocks: a swap or a bench holds it too, and a
    # crash loop (a new invocation each restart) does not start it again. A state from another boot
    # (a rig woken after an idle poweroff) or from before the timer was stopped and started again (a
    # repair) would stop the rig at once: it starts again.
    down = seen.get("not_serving") if seen["blocks"] == [seen.get("not_serving")] else None
    boot = seen.get("boot") or ""
    carried = (
        bool(down and boot)
        and isinstance(before, dict)
        and before.get("boot") == boot
        and _a_time(before.get("not_serving_since"), now)
    )
    down_since = before["not_serving_since"] if carried else (now if down else None)
    down_minutes = round((now - down_since) / 60, 2) if down_since is not None else None
    stop_down = bool(threshold) and down_since is not None and now - down_since >= allowance + threshold * 60
    if down:
        start, limit = round(allowance / 60, 2), round(allowance / 60 + (threshold or 0), 2)
        why = f"not serving: {down} since {down_minutes:.1f} min " + (
            f"(stops after {limit:g} min: {start:g} min to start + {threshold} idle)"
            if threshold
            else "(no idle stop set)"
        )
    elif seen["blocks"]:
        why = f"not idle: {'; '.join(seen['blocks'])}"
    else:
        why = f"idle {minutes:g} min" + (f" of {threshold}" if threshold else " (no idle stop set)")
    stop = stop or stop_down
    return {"invocation": seen["invocation"], "counters": seen["counters"], "idle_since": since,
            "checked_at": now, "threshold_minutes": threshold, "minutes_idle": minutes,
            "blocked_by": seen["blocks"], "boot": boot, "not_serving_since": down_since,
            "not_serving_minutes": down_minutes, "start_allowance_seconds": allowance,
            "stop": stop, "line": ("stopping the rig: " if stop else "") + why}  # fmt: skip


def idle_state_path() -> str:
    return os.path.join(setting("swap_state_dir"), IDLE_STATE)


def idle_load() -> dict | None:
    """The idle timer's last state, or None (none yet, or unreadable: then the count starts again)."""
    try:
        with open(idle_state_path(), encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def idle_report(state: dict | None) -> dict:
    """The idle object of status and idle: off when no idle timer has run."""
    if not state:
        return {
            "enabled": False,
            "minutes_idle": None,
            "threshold_minutes": None,
            "blocked_by": [],
            "not_serving_minutes": None,
            "start_allowance_seconds": None,
            "line": "off",
        }
    keys = ("minutes_idle", "threshold_minutes", "blocked_by", "not_serving_minutes",
            "start_allowance_seconds", "checked_at", "line")  # fmt: skip
    return {"enabled": bool(state.get("threshold_minutes")), **{k: state.get(k) for k in keys}}


def cmd_idle(args: argparse.Namespace) -> dict:
    rig = Rig(args.unit)
    before = idle_load()
    stored = (before or {}).get("threshold_minutes")
    kept = stored if isinstance(stored, int) and not isinstance(stored, bool) and stored > 0 else None
    # A call without the timer's options (a person's `rigctl idle`) reports what the timer decides.
    allowed = (before or {}).get("start_allowance_seconds")
    allowed = allowed if isinstance(allowed, int) and not isinstance(allowed, bool) and allowed > 0 else None
    allowance = args.start_allowance or allowed or IDLE_START_ALLOWANCE
    state = idle_decide(before, idle_observe(rig), time.time(), args.stop_after or kept, allowance)
    path = idle_state_path()
    unwritten = None
    try:
        with open(path + ".new", "w", encoding="utf-8") as fh:
            json.dump({k: v for k, v in state.items() if k != "stop"}, fh)
        os.replace(path + ".new", path)
    except OSError as exc:
        unwritten = RigctlError(f"cannot write {path}: {exc.strerror} (run rigctl as root)", EXIT_NO_CONFIG)
    stopping = state["stop"] and bool(args.stop_after)
    if args.stop_after:
        # The timer's decision, in the journal under its own tag before any poweroff.
        run(["logger", "-t", IDLE_TAG, "--", state["line"]])
    # A full disk (one way a vLLM fails to load) fails the write, but the count read from the last
    # state written still holds: the stop goes ahead, and the error is still the answer.
    if stopping:
        systemctl("poweroff")
    if unwritten:
        raise unwritten
    return {"ok": True, "stopping": stopping, **idle_report(state), "lines": [state["line"]]}


def systemctl(*args: str) -> None:
    res = run(["systemctl", *args], timeout=900)
    if res.returncode != 0:
        raise RigctlError(f"systemctl {' '.join(args)} failed: {(res.stderr or res.stdout).strip()}")


def cmd_status(args: argparse.Namespace) -> dict:
    return status(Rig(args.unit), args.expect_model)


def cmd_start(args: argparse.Namespace) -> dict:
    rig = Rig(args.unit)
    was_active = rig.props.get("ActiveState") == "active"
    # A deliberate start: a unit that gave up (start limit hit) may start again at once.
    run(["systemctl", "reset-failed", args.unit])
    before = int(rig.props.get("NRestarts") or 0)
    systemctl(args.command, args.unit)
    out = {"ok": True, "changed": args.command == "restart" or not was_active, "build": None, "url": rig.url}
    if args.no_wait:
        return {**out, "chat": None, "lines": [f"{args.unit}: {args.command} requested"]}
    return {**out, **wait_ready(rig, args, before, READY_CHAT)}


def cmd_wait(args: argparse.Namespace) -> dict:
    rig = Rig(args.unit)
    chat = (
        None if args.no_chat else read_request(READY_CHAT["max_tokens"]) if args.request_stdin else READY_CHAT
    )
    out = wait_ready(rig, args, int(rig.props.get("NRestarts") or 0), chat)
    return {"ok": True, **out, "lines": out["lines"] + (out["chat"]["lines"] if chat else [])}


def cmd_stop(args: argparse.Namespace) -> dict:
    rig = Rig(args.unit)
    systemctl("stop", args.unit)
    changed = rig.props.get("ActiveState") not in ("inactive", "failed")
    return {"ok": True, "changed": changed, "lines": [f"{args.unit}: stopped"]}


def cmd_logs(args: argparse.Namespace) -> dict:
    cmd = ["journalctl", "-u", args.unit, "--no-pager", "-o", "short-iso", "-n", str(args.lines)]
    if args.follow:
        sys.stdout.flush()
        os.execvp(cmd[0], [*cmd, "-f"])  # journalctl runs until interrupted
    res = run(cmd)
    if res.returncode != 0:
        raise RigctlError(f"journalctl failed: {res.stderr.strip()}")
    return {"ok": True, "lines": res.stdout.splitlines()}


def cmd_query(args: argparse.Namespace) -> dict:
    request = (
        read_request(args.max_tokens)
        if args.request_stdin
        else {"prompt": args.prompt, "max_tokens": args.max_tokens}
    )
    api = Endpoint(args.url, request.get("api_key", ""), args.ca_file) if args.url else rig_endpoint()[2]
    status, served = api.served()
    if status != 200 or not served:
        why = f"nothing answered: {api.error}" if status == -1 else f"status {status}"
        raise RigctlError(f"no model answering on {api.url}/v1/models ({why})")
    out = api.ask(served[0], request["prompt"], request["max_tokens"], args.timeout, request.get("agent"))
    if args.url:
        out["lines"].append(f"answered by {api.answered_by or '?'} through {api.url}")
    return {"ok": True, **out}


def cmd_clamp(args: argparse.Namespace) -> dict:
    checks = code_checks()
    return {
        "ok": bool(checks) and all(c["ok"] for c in checks),
        "checks": checks,
        "lines": check_lines(checks),
    }


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive(text: str) -> int:
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="rigctl",
        description="Control this rig's vLLM service (gemma-rig): a thin front over systemctl, "
        "journalctl and the local endpoint; the port and API key come from tpu.env.",
        epilog="exit codes: 0 ok, 1 failed, 2 usage, 3 not serving (status), 4 tpu.env or unit unreadable",
    )
    top.add_argument("--unit", default=SETTINGS.get("unit"), help="the systemd unit (default: %(default)s)")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="one JSON object on stdout (docs/mcp.md)")

    def add(name: str, help_text: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    p = add(
        "status",
        "health, model, KV cache tokens, clamp, memory, swap, uptime (exit 3 when not serving)",
        cmd_status,
    )
    p.add_argument(
        "--expect-model", default="", help="the build the inventory names: say when another serves"
    )

    def wait_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--timeout", type=float, default=900, help="seconds to wait (default: %(default)s)")
        p.add_argument(
            "--chat-timeout", type=float, default=600, help="seconds the chat may take (default: %(default)s)"
        )

    stdin = 'read {} from stdin as one JSON object {{"prompt": TEXT, "max_tokens": N}}'

    for name, what in (("start", "Start"), ("restart", "Restart")):
        p = add(name, f"{what} vLLM and wait until it answers /v1/models and a short chat", cmd_start)
        wait_options(p)
        p.add_argument("--no-wait", action="store_true", help="return once systemd has the request")
    p = add("wait", "Wait until vLLM answers /v1/models and a short chat; fail at once if it exits", cmd_wait)
    wait_options(p)
    p.add_argument("--model", default="", help="the name /v1/models must list (default: tpu.env's)")
    one = p.add_mutually_exclusive_group()
    one.add_argument("--no-chat", action="store_true", help="do not send the chat")
    one.add_argument("--request-stdin", action="store_true", help=stdin.format("the chat"))
    add("stop", "Stop vLLM", cmd_stop)
    p = add("logs", "The last lines of vLLM's journal", cmd_logs)
    p.add_argument("-n", "--lines", type=non_negative, default=50, help="how many (default: %(default)s)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (not with --json)")
    p = add("query", "Ask the served model one question", cmd_query)
    one = p.add_mutually_exclusive_group(required=True)
    one.add_argument("prompt", nargs="?", help="the user message")
    one.add_argument("--request-stdin", action="store_true",
                     help=stdin.format("the prompt (and tools, response_format; with --url, the API key as api_key)"))  # fmt: skip
    p.add_argument(
        "--max-tokens", type=non_negative, default=512, help="default: %(default)s (Gemma 4 reasons first)"
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds (default: %(default)s)")
    p.add_argument("--url", help="ask this endpoint (a gateway) instead of this rig's")
    p.add_argument("--ca-file", help="the CA certificate that --url's certificate must chain to")
    add(
        "clamp",
        "Run the code checks installed beside the unit: the Turing clamp present exactly once (T4, "
        "local), the tpu-inference patch applied (TPU); exit 1 otherwise",
        cmd_clamp,
    )
    p = add(
        "idle",
        "Whether vLLM has served nothing (its /metrics counters) and for how long; what keeps it busy",
        cmd_idle,
    )
    p.add_argument("--stop-after", type=positive, metavar="MINUTES",
                   help="power the rig off once idle this long (the idle timer's call)")  # fmt: skip
    p.add_argument("--start-allowance", type=positive, metavar="SECONDS",
                   help="seconds a start may take before time vLLM cannot serve counts as idle "
                        f"(the unit's start deadline; default: the last call's, else {IDLE_START_ALLOWANCE})")  # fmt: skip
    return top


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    if args.json and getattr(args, "follow", False):
        top.error("--follow does not go with --json")
    head = {"rigctl": SCHEMA, "command": args.command}
    try:
        result = args.func(args)
    except RigctlError as exc:
        print(f"rigctl: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({**head, "ok": False, "error": str(exc), "exit": exc.code}))
        return exc.code
    except KeyboardInterrupt:
        return EXIT_FAILED
    print(json.dumps({**head, **result}) if args.json else "\n".join(result["lines"]))
    if result["ok"]:
        return EXIT_OK
    return EXIT_NOT_SERVING if args.command == "status" else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
