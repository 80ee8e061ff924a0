#!/usr/bin/env python3
"""Time the rig's lifecycle on the local platform: what a user waits for, in one run.

    python measure/lifecycle_times.py [--runs N] [--cold-runs M] [--label NAME] [--record DIR]

On a rig of its own (container gemma-rig-speed, port 8020 unless told otherwise; an inventory
written to a temporary directory beside the repository's group_vars, so it never touches the
e2e rigs gemma-rig/gemma-rig-b), it measures:

- cold      `site.yml` from no container and no data volume to a rig that answers (M times);
- converged `site.yml` again on that rig, and its recap's changed count;
- check     `site.yml --check`, and its changed count;
- restart   `playbooks/restart.yml`: the playbook, and its downtime;
- swap      `swap.yml -e model=OTHER` and back: each playbook and its downtime;
- swap-same `swap.yml -e model=SERVED` (nothing to do);
- status    `playbooks/status.yml`.

Downtime is measured from outside, as a client sees it: a thread asks GET /v1/models every
--poll seconds; the rig is down from the first poll that fails and answering again at the end of
the first one-token chat completion that succeeds once /v1/models lists the expected model.
systemd's own timestamps of the same restart (stop began, stopped, ExecStartPre done, started) are
read from the unit after each run and recorded beside it.

Every step but cold runs N times; the medians and the ratios (swap downtime / restart downtime,
converged / cold) are printed, with the like-for-like difference: the swaps back to --model (the
model the restarts restart; each build loads at its own pace) against the restarts. With --record
DIR they are written to DIR/LABEL.json together with every run's figures, the commit and the
machine's load. The rig is removed at the end unless --keep.
This is a measurement, not a test: it prints figures and never fails on them (only on a playbook
that fails).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
CATALOG_KEY = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$", re.MULTILINE)
# The steps every run makes, in this order.
STEPS = ("converged", "check", "restart", "swap", "swap_same", "status")
# The unit's timestamps that bound a restart, in the order they happen.
UNIT_STAMPS = (
    "ActiveExitTimestamp",  # the stop began
    "InactiveEnterTimestamp",  # vLLM has stopped
    "ExecMainStartTimestamp",  # the ExecStartPre guards are done and vLLM's own process runs
    "ActiveEnterTimestamp",  # systemd calls it started (Type=simple: as the main process starts)
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line; a bad value ends with one line naming it."""
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python measure/lifecycle_times.py --runs 3 --label after --record evidence/lifecycle",
    )
    p.add_argument("--runs", type=int, default=3, help="repeats of every step but cold (default 3)")
    p.add_argument("--cold-runs", type=int, default=1, help="cold bring-ups, each from nothing (default 1)")
    p.add_argument(
        "--container", default="gemma-rig-speed", help="the bench rig's container (default gemma-rig-speed)"
    )
    p.add_argument("--host", default="rig-speed", help="its inventory host name (default rig-speed)")
    p.add_argument("--port", type=int, default=8020, help="its vLLM port (default 8020)")
    p.add_argument("--model", default="tiny-emb4", help="the model site.yml serves (default tiny-emb4)")
    p.add_argument(
        "--swap-to", default="tiny-w8a8", help="the model swapped to and back from (default tiny-w8a8)"
    )
    p.add_argument("--poll", type=float, default=0.2, help="seconds between downtime polls (default 0.2)")
    p.add_argument("--label", default="run", help="name of the record (default run)")
    p.add_argument("--record", type=Path, help="write LABEL.json (every figure) into this directory")
    p.add_argument("--keep", action="store_true", help="leave the rig running at the end")
    p.add_argument(
        "--skip-cold", action="store_true", help="reuse a rig that is already up (cold not measured)"
    )
    p.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"comma-separated steps to run after the cold ones (default all: {','.join(STEPS)})",
    )
    args = p.parse_args(argv)
    for name in ("runs", "cold_runs"):
        if getattr(args, name) < (0 if name == "cold_runs" else 1):
            p.error(
                f"--{name.replace('_', '-')} must be at least {0 if name == 'cold_runs' else 1}, got {getattr(args, name)}"
            )
    if not 1 <= args.port <= 65535:
        p.error(f"--port must be 1..65535, got {args.port}")
    if args.container in ("gemma-rig", "gemma-rig-b"):
        p.error(f"--container {args.container} is an e2e rig; the bench needs one of its own")
    if args.poll <= 0:
        p.error(f"--poll must be > 0 s, got {args.poll}")
    for name in ("model", "swap_to", "label"):
        if not CATALOG_KEY.match(getattr(args, name)):
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)!r} is not a plain name ([a-z0-9._-])")
    if args.model == args.swap_to:
        p.error(f"--swap-to must differ from --model ({args.model})")
    steps = [x for x in args.steps.split(",") if x]
    unknown = [x for x in steps if x not in STEPS]
    if unknown or not steps:
        p.error(f"--steps: unknown {', '.join(unknown) or '(none given)'}; valid: {','.join(STEPS)}")
    args.steps = steps
    if args.skip_cold:
        args.cold_runs = 0
    if args.cold_runs == 0 and not args.skip_cold:
        p.error("--cold-runs 0 needs --skip-cold (a rig that is already up)")
    return args


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP block as {host: {counter: value}}; empty when there is none."""
    start = output.rfind("PLAY RECAP")
    if start < 0:
        return {}
    recap = {}
    for m in _RECAP.finditer(output[start:]):
        recap[m.group("host")] = {k: int(v) for k, v in (kv.split("=") for kv in m.group("counts").split())}
    return recap


def median(values: list[float]) -> float | None:
    """The median, or None for no values (a step that was not measured)."""
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def downtime(samples: list[tuple[float, bool]], answered: float | None) -> float | None:
    """Seconds from the first failed poll to ``answered`` (the first chat that succeeded after it).

    ``samples`` are (time, ok) polls in time order. None when no poll failed (the client never
    saw the service down: the poll interval was too coarse or nothing restarted) or it never
    answered again.
    """
    down = next((t for t, ok in samples if not ok), None)
    if down is None or answered is None or answered < down:
        return None
    return answered - down


def summarize(runs: dict[str, list[float]]) -> dict[str, float | None]:
    """Medians of every figure, and the ratios the targets are stated in."""
    med = {k: median(v) for k, v in runs.items()}
    med["swap_over_restart_downtime"] = ratio(med.get("swap_downtime_s"), med.get("restart_downtime_s"))
    med["converged_over_cold"] = ratio(med.get("converged_s"), med.get("cold_s"))
    sd, rd = med.get("swap_downtime_s"), med.get("restart_downtime_s")
    med["swap_minus_restart_downtime_s"] = None if sd is None or rd is None else sd - rd
    # Like for like: the swaps back to the model the restarts restart (each build loads at its own
    # pace, so a swap to another build also measures that build's start).
    bd = med.get("swap_back_downtime_s")
    med["swap_back_minus_restart_downtime_s"] = None if bd is None or rd is None else bd - rd
    return med


def table(med: dict[str, float | None], label: str) -> str:
    """The medians as a markdown table (README style)."""
    rows = [
        ("cold site.yml", "cold_s", "s"),
        ("converged site.yml", "converged_s", "s"),
        ("converged changed", "converged_changed", ""),
        ("site.yml --check", "check_s", "s"),
        ("--check changed", "check_changed", ""),
        ("restart.yml", "restart_s", "s"),
        ("restart downtime", "restart_downtime_s", "s"),
        ("swap.yml (to and back)", "swap_s", "s"),
        ("swap downtime", "swap_downtime_s", "s"),
        ("swap downtime, back to the restart's model", "swap_back_downtime_s", "s"),
        ("swap.yml to the served model", "swap_same_s", "s"),
        ("status.yml", "status_s", "s"),
        ("swap downtime / restart downtime", "swap_over_restart_downtime", "x"),
        ("swap downtime - restart downtime", "swap_minus_restart_downtime_s", "s"),
        ("swap back downtime - restart downtime", "swap_back_minus_restart_downtime_s", "s"),
        ("converged / cold", "converged_over_cold", "x"),
    ]
    out = [f"| step ({label}) | median |", "|---|---|"]
    for name, key, unit in rows:
        v = med.get(key)
        shown = (
            "-"
            if v is None
            else (f"{v:.0f}" if unit == "" else f"{v:.2f}{unit}" if unit == "x" else f"{v:.1f} {unit}")
        )
        out.append(f"| {name} | {shown} |")
    return "\n".join(out)


# ---- the parts that drive a rig ---------------------------------------------------------------


@dataclass
class Step:
    """One playbook run."""

    name: str
    seconds: float
    rc: int
    changed: int | None
    downtime_s: float | None = None
    unit: dict[str, float] = field(default_factory=dict)


class Poller(threading.Thread):
    """Polls /v1/models; once it is down and lists ``model`` again, one chat marks 'answering'."""

    def __init__(self, port: int, model: str, interval: float) -> None:
        super().__init__(daemon=True)
        self.port, self.model, self.interval = port, model, interval
        self.samples: list[tuple[float, bool]] = []
        self.answered: float | None = None
        self.halt = threading.Event()

    def _get(self, path: str, body: dict | None = None, timeout: float = 2) -> dict | None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.load(r)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def run(self) -> None:
        while not self.halt.is_set() and self.answered is None:
            got = self._get("/v1/models")
            ids = [m.get("id") for m in (got or {}).get("data", [])]
            ok = self.model in ids
            self.samples.append((time.time(), got is not None))
            if ok and any(not s for _, s in self.samples):
                body = {"model": self.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
                if self._get("/v1/chat/completions", body, timeout=60) is not None:
                    self.answered = time.time()
                    break
            self.halt.wait(self.interval)


class Rig:
    """The bench's own local rig and how to run playbooks against it."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        inv = workdir / "inventory"
        inv.mkdir()
        # The repository's group_vars apply to this inventory as they do to inventory/local.yml.
        (inv / "group_vars").symlink_to(ROOT / "inventory" / "group_vars")
        (inv / "bench.yml").write_text(
            "rigs:\n  children:\n    local:\n      hosts:\n"
            f"        {args.host}:\n          ansible_host: {args.container}\n          rig_port: {args.port}\n"
        )
        self.inventory = inv / "bench.yml"
        self.env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "CONTAINERS_CONF": str(ROOT / "roles/local_rig/files/containers.conf"),
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
        }
        self.log = workdir / "ansible.log"

    def podman(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *argv], env=self.env, capture_output=True, text=True, check=False)

    def remove(self) -> None:
        self.podman("rm", "-f", "-t", "5", self.args.container)
        self.podman("volume", "rm", "-f", f"{self.args.container}-data")

    def playbook(self, name: str, playbook: str, *extra: str, expect_model: str | None = None) -> Step:
        """Run one playbook; with ``expect_model``, measure the downtime a client saw meanwhile."""
        poller = Poller(self.args.port, expect_model, self.args.poll) if expect_model else None
        if poller:
            poller.start()
        started = time.time()
        proc = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), playbook, "-i", str(self.inventory), *extra],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.time() - started
        with self.log.open("a") as f:
            f.write(f"\n===== {name}: {playbook} {' '.join(extra)} ({seconds:.1f} s, rc {proc.returncode})\n")
            f.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise SystemExit(
                f"{name}: {playbook} failed (rc {proc.returncode}); see {self.log}:\n{proc.stdout[-3000:]}"
            )
        recap = parse_recap(proc.stdout).get(self.args.host, {})
        step = Step(name, seconds, proc.returncode, recap.get("changed"))
        if poller:
            if poller.answered is None:  # the playbook ended as soon as the model answered
                poller.join(timeout=30)
            poller.halt.set()
            poller.join()
            step.downtime_s = downtime(poller.samples, poller.answered)
            step.unit = self.unit_stamps()
        return step

    def unit_stamps(self) -> dict[str, float]:
        """The vllm unit's timestamps (epoch seconds) of its last stop and start."""
        out = self.podman(
            "exec",
            self.args.container,
            "systemctl",
            "show",
            "vllm",
            "--timestamp=us+utc",
            *(f"--property={p}" for p in UNIT_STAMPS),
        ).stdout
        stamps = {}
        for line in out.splitlines():
            key, _, value = line.partition("=")
            if value.strip():
                # "Tue 2026-12-01 03:59:48.123456 UTC"
                when = dt.datetime.strptime(" ".join(value.split()[1:3]), "%Y-%m-%d %H:%M:%S.%f")
                stamps[key] = when.replace(tzinfo=dt.UTC).timestamp()
        return stamps


def unit_phases(stamps: dict[str, float]) -> dict[str, float]:
    """The restart's phases from the unit's timestamps: stopping, the ExecStartPre guards."""
    phases = {}
    if {"ActiveExitTimestamp", "InactiveEnterTimestamp"} <= stamps.keys():
        phases["stopping_s"] = stamps["InactiveEnterTimestamp"] - stamps["ActiveExitTimestamp"]
    if {"InactiveEnterTimestamp", "ExecMainStartTimestamp"} <= stamps.keys():
        phases["start_pre_s"] = stamps["ExecMainStartTimestamp"] - stamps["InactiveEnterTimestamp"]
    return phases


def machine() -> dict:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    )
    return {"commit": commit, "dirty": dirty, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures: dict[str, list[float]] = {}
    steps: list[dict] = []

    def note(step: Step, key: str) -> None:
        steps.append({**asdict(step), "phases": unit_phases(step.unit)})
        figures.setdefault(f"{key}_s", []).append(step.seconds)
        if step.downtime_s is not None:
            figures.setdefault(f"{key}_downtime_s", []).append(step.downtime_s)
        extra = (
            f", downtime {step.downtime_s:.1f} s {unit_phases(step.unit)}"
            if step.downtime_s is not None
            else ""
        )
        print(f"{step.name}: {step.seconds:.1f} s, changed={step.changed}{extra}", flush=True)

    record = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine(),
        "started": time.time(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-lifecycle-") as tmp:
        rig = Rig(args, Path(tmp))
        try:
            for i in range(args.cold_runs):
                rig.remove()
                note(rig.playbook(f"cold {i + 1}", "site.yml"), "cold")
            for i in range(args.runs):
                if "converged" in args.steps:
                    s = rig.playbook(f"converged {i + 1}", "site.yml")
                    note(s, "converged")
                    figures.setdefault("converged_changed", []).append(s.changed or 0)
                if "check" in args.steps:
                    s = rig.playbook(f"check {i + 1}", "site.yml", "--check")
                    note(s, "check")
                    figures.setdefault("check_changed", []).append(s.changed or 0)
                if "restart" in args.steps:
                    note(
                        rig.playbook(f"restart {i + 1}", "playbooks/restart.yml", expect_model=args.model),
                        "restart",
                    )
                if "swap" in args.steps:
                    for to in (args.swap_to, args.model):
                        step = rig.playbook(
                            f"swap to {to} {i + 1}", "swap.yml", "-e", f"model={to}", expect_model=to
                        )
                        note(step, "swap")
                        if to == args.model and step.downtime_s is not None:
                            figures.setdefault("swap_back_downtime_s", []).append(step.downtime_s)
                if "swap_same" in args.steps:
                    step = rig.playbook(
                        f"swap to the served model {i + 1}", "swap.yml", "-e", f"model={args.model}"
                    )
                    note(step, "swap_same")
                if "status" in args.steps:
                    note(rig.playbook(f"status {i + 1}", "playbooks/status.yml"), "status")
        finally:
            if not args.keep:
                rig.remove()
            if rig.log.exists() and args.record:
                args.record.mkdir(parents=True, exist_ok=True)
                (args.record / f"{args.label}.log").write_text(rig.log.read_text())
    med = summarize(figures)
    record.update(runs=figures, steps=steps, medians=med, loadavg_end=os.getloadavg())
    print(table(med, args.label))
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
        (args.record / f"{args.label}.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"recorded {args.record / (args.label + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
