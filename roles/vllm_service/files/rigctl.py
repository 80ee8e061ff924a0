#!/usr/bin/python3 -I
"""rigctl: the rig's own command, a thin front over systemctl, journalctl and the local endpoint.

Installed on every rig by the vllm_service role (/usr/local/bin/rigctl). Standard library only.
Where things are comes from the unit itself (`systemctl show`): tpu.env from EnvironmentFiles=,
the clamp check and the swap journal from its ExecStartPre lines, so rigctl follows whatever the
role installed. The port and the API key come from tpu.env (RIG_PORT, VLLM_API_KEY); the key is
sent as a bearer token and never printed.

Exit codes (every subcommand):
  0  done / serving / clamp present once
  1  the action failed (a start that did not come up, a query that failed, the clamp missing or
     doubled, journalctl failed)
  2  usage error (bad arguments)
  3  status only: the service is not serving (stopped, failed or not healthy)
  4  tpu.env or the unit cannot be read (not installed, or run without root)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_SERVING, EXIT_NO_CONFIG = 0, 1, 2, 3, 4
DEFAULT_UNIT = "vllm"
# The rig contract's paths (docs/rig-contract.md), used only when the unit does not name them.
DEFAULT_ENV_FILE = "/etc/gemma-rig/tpu.env"
DEFAULT_SWAP_STATE_DIR = "/var/lib/gemma-rig"
START_LIMIT_REMEDY = "fix the cause, then playbooks/start.yml"


class RigctlError(Exception):
    """A failure with its exit code and a one-line message."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


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
    props = parse_show(res.stdout)
    if props.get("LoadState") == "not-found":
        raise RigctlError(f"{unit}.service is not installed on this host", EXIT_NO_CONFIG)
    return props


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show` output as a dict; a property listed on several lines (one ExecStartPre=
    per command) keeps every line, joined by newlines."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            props[key] = f"{props[key]}\n{value}" if key in props else value
    return props


def exec_argvs(prop: str) -> list[list[str]]:
    """The argv of each command in an Exec* property ('{ path=... ; argv[]=A B C ; ... }')."""
    return [shlex.split(m) for m in re.findall(r"argv\[\]=(.*?) ;", prop)]


def env_file_path(props: dict[str, str]) -> str:
    """tpu.env as the unit reads it (EnvironmentFiles=PATH (ignore_errors=no))."""
    found = props.get("EnvironmentFiles", "").split()
    return found[0] if found else DEFAULT_ENV_FILE


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
        self.env_file = env_file_path(self.props)
        self.env = read_env(self.env_file)
        if "RIG_PORT" not in self.env:
            raise RigctlError(f"{self.env_file} has no RIG_PORT", EXIT_NO_CONFIG)
        self.url = f"http://127.0.0.1:{self.env['RIG_PORT']}"

    def refresh(self) -> None:
        """Read the unit's properties again (after a start or stop)."""
        self.props = unit_props(self.unit)

    def _headers(self) -> dict[str, str]:
        key = self.env.get("VLLM_API_KEY", "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def http(self, path: str, body: dict | None = None, timeout: float = 5) -> tuple[int, dict | None]:
        """(status, decoded JSON or None); status -1 when nothing answers (as status.yml shows it)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {**self._headers(), **({"Content-Type": "application/json"} if data else {})}
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (urllib.error.URLError, OSError):
            return -1, None
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    def served(self) -> tuple[int, list[str]]:
        """(status of /v1/models, the model ids it lists)."""
        status, doc = self.http("/v1/models")
        return status, [m.get("id", "") for m in (doc or {}).get("data", [])]

    def exec_pre(self, needle: str) -> list[str] | None:
        """The ExecStartPre argv whose words include ``needle``."""
        for argv in exec_argvs(self.props.get("ExecStartPre", "")):
            if any(needle in word for word in argv):
                return argv
        return None

    def swap_state_dir(self) -> str:
        argv = self.exec_pre("swap-journal") or []
        return argv[argv.index("--state-dir") + 1] if "--state-dir" in argv[:-1] else DEFAULT_SWAP_STATE_DIR

    # The start-time checks of the code the rig patches, by the platform's unit: the Turing clamp
    # (T4 and local), the tpu-inference patch (TPU). Each is (name in the report, argv needle).
    CODE_CHECKS = (("clamp", "clamp-check"), ("tpu-inference patch", "tpu_inference_patch"))

    def code_checks(self) -> list[tuple[str, bool, str]]:
        """(name, ok, the check's own words) for each code check the unit runs before vLLM starts,
        running the unit's own ExecStartPre command."""
        found = []
        for name, needle in self.CODE_CHECKS:
            argv = self.exec_pre(needle)
            if argv is not None:
                res = run(argv)
                found.append((name, res.returncode == 0, (res.stdout + res.stderr).strip()))
        return found


def code_check_lines(rig: Rig) -> tuple[list[str], bool]:
    """One line per code check the unit runs before vLLM (status and `rigctl clamp` word them
    alike), and whether all passed; a unit with none fails: nothing stops an unpatched start."""
    checks = rig.code_checks()
    if not checks:
        return [
            f"clamp: MISSING: {rig.unit}.service runs no clamp or tpu-inference patch check before vLLM"
        ], False
    names = [name for name, _, _ in checks]
    lines = [] if "clamp" in names else ["clamp: not used on this platform"]  # status.yml's words
    for name, ok, words in checks:
        if name == "clamp":
            lines.append(f"clamp: {'present once' if ok else 'MISSING OR DUPLICATED: ' + words}")
        else:
            lines.append(f"{name}: {'present' if ok else 'MISSING: ' + words}")
    return lines, all(ok for _, ok, _ in checks)


def journal(unit: str, *args: str) -> str:
    res = run(["journalctl", "--no-pager", *args])
    return res.stdout if res.returncode == 0 else ""


def status_lines(rig: Rig) -> tuple[list[str], bool]:
    """The status screen, worded as playbooks/status.yml words it, and whether the rig serves."""
    p = rig.props
    active, sub = p.get("ActiveState", "?"), p.get("SubState", "?")
    lines = [f"service: {active}/{sub} since {p.get('ActiveEnterTimestamp') or '-'}"]
    if active == "failed":
        failed_log = journal(rig.unit, "-u", rig.unit, "-n", "60", "-o", "short-iso")
        gave_up = p.get("Result") == "start-limit-hit" or "Start request repeated too quickly" in failed_log
        own = [line for line in failed_log.splitlines() if not re.search(r" systemd\[1\]: ", line)]
        reason = re.sub(r"^\S+ \S+ [^:]+: ", "", own[-1]) if own else "no log line"
        head = (
            f"gave up after repeated failed starts (start limit hit; no more automatic restarts: {START_LIMIT_REMEDY})"
            if gave_up
            else f"failed ({p.get('Result', '?')})"
        )
        lines.append(f"{head}: {reason}")
    else:
        lines.append(f"restarts: {p.get('NRestarts') or '0'}")
    try:
        with open(os.path.join(rig.swap_state_dir(), "swap.json"), encoding="utf-8") as fh:
            j = json.load(fh)
        lines.append(f"last swap: {j.get('from')} -> {j.get('to')}, {j.get('phase')}")
    except (OSError, ValueError):
        lines.append("last swap: none journalled")
    health, _ = rig.http("/health")
    lines.append(f"health: {'ok' if health == 200 else f'down ({health})'}")
    models_status, served = rig.served()
    if served:  # the build first, then the alias it also answers to (status.yml words it the same)
        model = served[0] + (f" (also answers to {', '.join(served[1:])})" if len(served) > 1 else "")
    elif models_status == 401:
        model = "refused our key (401): rig_api_key differs from the VLLM_API_KEY in tpu.env"
    else:
        model = "none answering"
    lines.append(f"model: {model}")
    invocation = p.get("InvocationID", "")
    log = journal(rig.unit, "-o", "cat", f"_SYSTEMD_INVOCATION_ID={invocation}") if invocation else ""
    kv = re.findall(r"KV cache size: ([0-9,]+) tokens", log)
    lines.append(f"KV cache tokens: {kv[-1] if kv else 'not logged yet'}")
    lines.extend(code_check_lines(rig)[0])
    lines.extend(host_lines())
    return lines, active == "active" and health == 200


def host_lines() -> list[str]:
    """Accelerator (or CPU) memory, swap and uptime, as status.yml shows them."""
    out: list[str] = []
    smi = (
        run(["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"])
        if any(
            os.access(os.path.join(d, "nvidia-smi"), os.X_OK)
            for d in os.environ.get("PATH", "/usr/bin").split(":")
        )
        else None
    )
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
    """Wait for /health and /v1/models; fail at once when vLLM exits (as ready.yml does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rig.refresh()
        restarts = int(rig.props.get("NRestarts") or 0)
        if restarts > restarts_before or rig.props.get("ActiveState") in ("failed", "inactive"):
            tail = journal(rig.unit, "-u", rig.unit, "-n", "25", "-o", "cat").rstrip()
            raise RigctlError(
                f"vLLM exited while starting (automatic restarts: {restarts}, unit: "
                f"{rig.props.get('ActiveState')}); its last lines:\n{tail}"
            )
        if rig.http("/health")[0] == 200:
            status, served = rig.served()
            if status == 200 and served:
                return served[0]  # the build (its alias follows in the list)
        time.sleep(2)
    raise RigctlError(f"{rig.unit} did not answer /health and /v1/models within {timeout:.0f} s")


def systemctl(*args: str) -> None:
    res = run(["systemctl", *args], timeout=900)
    if res.returncode != 0:
        raise RigctlError(f"systemctl {' '.join(args)} failed: {(res.stderr or res.stdout).strip()}")


def cmd_status(args: argparse.Namespace) -> int:
    lines, serving = status_lines(Rig(args.unit))
    print("\n".join(lines))
    return EXIT_OK if serving else EXIT_NOT_SERVING


def _start(args: argparse.Namespace, verb: str) -> int:
    rig = Rig(args.unit)
    # A deliberate start: a unit that gave up (start limit hit) may start again at once.
    run(["systemctl", "reset-failed", args.unit])
    before = int(rig.props.get("NRestarts") or 0)
    systemctl(verb, args.unit)
    if args.no_wait:
        print(f"{args.unit}: {verb} requested")
        return EXIT_OK
    model = wait_ready(rig, args.timeout, before)
    print(f"{args.unit}: serving {model} on {rig.url}")
    return EXIT_OK


def cmd_start(args: argparse.Namespace) -> int:
    return _start(args, "start")


def cmd_restart(args: argparse.Namespace) -> int:
    return _start(args, "restart")


def cmd_stop(args: argparse.Namespace) -> int:
    Rig(args.unit)  # the unit must exist
    systemctl("stop", args.unit)
    print(f"{args.unit}: stopped")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    cmd = ["journalctl", "-u", args.unit, "--no-pager", "-o", "short-iso", "-n", str(args.lines)]
    if args.follow:
        sys.stdout.flush()
        os.execvp(cmd[0], [*cmd, "-f"])  # journalctl runs until interrupted
    res = run(cmd)
    if res.returncode != 0:
        raise RigctlError(f"journalctl failed: {res.stderr.strip()}")
    sys.stdout.write(res.stdout)
    return EXIT_OK


def cmd_query(args: argparse.Namespace) -> int:
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
    if status != 200 or not doc or not doc.get("choices"):
        raise RigctlError(f"the chat completion failed (status {status})")
    message = doc["choices"][0].get("message", {})
    content = (message.get("content") or "").strip()
    print(f"{doc.get('model')}: {content}")
    if not content and (message.get("reasoning_content") or message.get("reasoning")):
        print(
            f"(reasoning only: no answer within max_tokens={args.max_tokens}, "
            f"finish_reason {doc['choices'][0].get('finish_reason')})"
        )
    usage = doc.get("usage", {})
    print(f"tokens: {usage.get('prompt_tokens')} in, {usage.get('completion_tokens')} out")
    return EXIT_OK


def cmd_clamp(args: argparse.Namespace) -> int:
    lines, ok = code_check_lines(Rig(args.unit))
    print("\n".join(lines))
    return EXIT_OK if ok else EXIT_FAILED


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
    top.add_argument("--unit", default=DEFAULT_UNIT, help="the systemd unit (default: %(default)s)")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, func) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    add(
        "status",
        "health, model, KV cache tokens, clamp, memory, swap, uptime (exit 3 when not serving)",
        cmd_status,
    )
    for name, func, what in (("start", cmd_start, "Start"), ("restart", cmd_restart, "Restart")):
        p = add(name, f"{what} vLLM and wait until it answers /health and /v1/models", func)
        p.add_argument("--timeout", type=float, default=900, help="seconds to wait (default: %(default)s)")
        p.add_argument("--no-wait", action="store_true", help="return once systemd has the request")
    add("stop", "Stop vLLM", cmd_stop)
    p = add("logs", "The last lines of vLLM's journal", cmd_logs)
    p.add_argument("-n", "--lines", type=non_negative, default=50, help="how many (default: %(default)s)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p = add("query", "Ask the served model one question", cmd_query)
    p.add_argument("prompt", help="the user message")
    p.add_argument(
        "--max-tokens", type=non_negative, default=512, help="default: %(default)s (Gemma 4 reasons first)"
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds (default: %(default)s)")
    add(
        "clamp",
        "Run the unit's start-time code checks: the Turing clamp present exactly once (T4, local), "
        "the tpu-inference patch applied (TPU); exit 1 otherwise",
        cmd_clamp,
    )
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except RigctlError as exc:
        print(f"rigctl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
