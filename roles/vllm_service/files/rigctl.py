#!/usr/bin/python3 -I
"""rigctl: the rig's own command and the one place that works its state out: status, start, stop,
restart, logs, query and the start-time code checks. The ops playbooks run it (`--json`) and word
what it reports; docs/mcp.md gives the JSON schema.

Installed on every rig by the vllm_service role (/usr/local/bin/rigctl), which writes SETTINGS
below from the inventory's names. Standard library only. The port and the API key come from tpu.env
(RIG_PORT, VLLM_API_KEY); the key is sent as a bearer token and never printed.

Exit codes (every subcommand):
  0  done / serving / every code check passed
  1  the action failed (a start that did not come up, a query that failed, a code check failed,
     journalctl failed)
  2  usage error (bad arguments)
  3  status only: the service is not serving (stopped, failed or not healthy)
  4  tpu.env or the unit cannot be read (not installed, or run without root)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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
READY_CHAT = {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 8}


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


class Rig:
    """The local service: its unit, its tpu.env and its endpoint."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.props = unit_props(unit)
        self.env_file = setting("env_file")
        self.env = read_env(self.env_file)
        if "RIG_PORT" not in self.env:
            raise RigctlError(f"{self.env_file} has no RIG_PORT", EXIT_NO_CONFIG)
        self.url = f"http://127.0.0.1:{self.env['RIG_PORT']}"

    def refresh(self) -> None:
        """Read the unit's properties again (after a start or stop)."""
        self.props = unit_props(self.unit)

    def http(self, path: str, body: dict | None = None, timeout: float = 5) -> tuple[int, object]:
        """(status, decoded JSON or None); status -1 when nothing answers."""
        key = self.env.get("VLLM_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        data = json.dumps(body).encode() if body is not None else None
        if data:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw, status = response.read(), response.status
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (urllib.error.URLError, OSError):
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
    try:
        with open(os.path.join(setting("swap_state_dir"), "swap.json"), encoding="utf-8") as fh:
            swap = json.load(fh)
    except (OSError, ValueError):
        swap = None
    if isinstance(swap, dict):
        swap = {k: swap.get(k) for k in ("from", "to", "phase")}
        lines.append(f"last swap: {swap['from']} -> {swap['to']}, {swap['phase']}")
    else:
        swap = None
        lines.append("last swap: none journalled")
    health, _ = rig.http("/health")
    lines.append(f"health: {'ok' if health == 200 else f'down ({health})'}")
    models_status, served = rig.served()
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


def wait_ready(rig: Rig, timeout: float, restarts_before: int) -> str:
    """Wait until /v1/models lists the name tpu.env serves (swap.yml changes it, not the
    inventory) and a short chat answers; fail at once when vLLM exits instead."""
    rig.env = read_env(rig.env_file)
    name = rig.env.get("RIG_SERVED_MODEL_NAME", "")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rig.refresh()
        restarts = int(rig.props.get("NRestarts") or 0)
        if restarts > restarts_before or rig.props.get("ActiveState") in ("failed", "inactive"):
            tail = journal("-u", rig.unit, "-n", "25", "-o", "cat").rstrip()
            raise RigctlError(
                f"vLLM exited while starting (automatic restarts: {restarts}, unit: "
                f"{rig.props.get('ActiveState')}); its last lines:\n{tail}"
            )
        status, served = rig.served()
        if status == 200 and served and (not name or name in served):
            chat, doc = rig.http("/v1/chat/completions", {"model": served[0], **READY_CHAT}, timeout=600)
            if chat != 200 or not isinstance(doc, dict) or not doc.get("choices"):
                raise RigctlError(f"{served[0]} is listed but a chat completion failed (status {chat})")
            return served[0]
        time.sleep(2)
    raise RigctlError(f"{rig.unit} did not list {name or 'a model'} on /v1/models within {timeout:.0f} s")


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
        return {**out, "lines": [f"{args.unit}: {args.command} requested"]}
    out["build"] = wait_ready(rig, args.timeout, before)
    return {**out, "lines": [f"{args.unit}: serving {out['build']} on {rig.url}"]}


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
    rig = Rig(args.unit)
    status, served = rig.served()
    if status != 200 or not served:
        raise RigctlError(f"no model answering on {rig.url}/v1/models (status {status})")
    body = {
        "model": served[0],
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
    }
    status, doc = rig.http("/v1/chat/completions", body, timeout=args.timeout)
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if status != 200 or not choices or not isinstance(choices[0], dict):
        raise RigctlError(f"the chat completion failed (status {status})")
    message = choices[0].get("message") or {}
    answer = str(message.get("content") or "").strip()
    reasoning = str(message.get("reasoning_content") or message.get("reasoning") or "")
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    out = {"ok": True, "model": doc.get("model"), "answer": answer, "reasoning_only": not answer and bool(reasoning),
           "reasoning_chars": len(reasoning), "finish_reason": choices[0].get("finish_reason"), "usage": usage}  # fmt: skip
    lines = [f"{out['model']}: {answer}"]
    if out["reasoning_only"]:
        lines.append(
            f"(reasoning only: no answer within max_tokens={args.max_tokens}, finish_reason {out['finish_reason']})"
        )
    lines.append(f"tokens: {usage.get('prompt_tokens')} in, {usage.get('completion_tokens')} out")
    return {**out, "lines": lines}


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
    for name, what in (("start", "Start"), ("restart", "Restart")):
        p = add(name, f"{what} vLLM and wait until it answers /v1/models and a short chat", cmd_start)
        p.add_argument("--timeout", type=float, default=900, help="seconds to wait (default: %(default)s)")
        p.add_argument("--no-wait", action="store_true", help="return once systemd has the request")
    add("stop", "Stop vLLM", cmd_stop)
    p = add("logs", "The last lines of vLLM's journal", cmd_logs)
    p.add_argument("-n", "--lines", type=non_negative, default=50, help="how many (default: %(default)s)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (not with --json)")
    p = add("query", "Ask the served model one question", cmd_query)
    p.add_argument("prompt", help="the user message")
    p.add_argument(
        "--max-tokens", type=non_negative, default=512, help="default: %(default)s (Gemma 4 reasons first)"
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds (default: %(default)s)")
    add(
        "clamp",
        "Run the code checks installed beside the unit: the Turing clamp present exactly once (T4, "
        "local), the tpu-inference patch applied (TPU); exit 1 otherwise",
        cmd_clamp,
    )
    return top


def main(argv: Sequence[str] | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    if args.json and getattr(args, "follow", False):
        top.error("--follow does not go with --json")
    head = {"rigctl": SCHEMA, "command": args.command}
    try:
        if not args.unit:
            raise RigctlError("rigctl has no unit setting: install it with site.yml", EXIT_NO_CONFIG)
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
