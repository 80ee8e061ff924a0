#!/usr/bin/env python3
"""The rig's swap journal, and the start guard that makes a swap crash-safe.

A swap writes a journal before it touches anything (from, to, phase) and keeps a copy of the old
tpu.env next to it. The vllm unit runs ``guard`` as a root ExecStartPre on every start:

- no journal, or a finished one: start as usual;
- ``staging`` (the new checkpoint is being pushed): nothing was switched, start as usual;
- ``switching`` (the swap switched ``current`` and tpu.env and is restarting vLLM this very
  moment, in this boot): this start is the swap's own trial; it is consumed (phase ``trial``);
- any other start before the swap commits (a crash of the new model, a reboot, a restart by
  hand, a trial left from another boot): ``current`` and tpu.env go back to the journalled old
  ones (phase ``reverted``) and this start fails, because systemd read tpu.env before the guard
  ran; ``Restart=`` then starts the old model.

So whatever happens to the controller, a (re)start serves a model that answered once, or the old
one. The next swap.yml or site.yml reads the journal and finishes or rolls back what it finds.
Standard library only: the rig's system Python runs it as root. One JSON object on stdout.

  swap_journal.py show
  swap_journal.py begin --from KEY --to KEY
  swap_journal.py switch --to-target DIR --env-next FILE     (switch, then restart vLLM)
  swap_journal.py guard                                      (ExecStartPre=+)
  swap_journal.py commit
  swap_journal.py rollback --reason TEXT
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PHASES = ("staging", "switching", "trial", "committed", "reverted", "rolled-back")
# A swap is over, one way or the other, in these phases; nothing is left to resolve.
DONE = ("committed", "rolled-back")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class JournalError(Exception):
    """A request the journal's state does not allow; the message is shown as is."""


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, like: Path | None = None, mode: int = 0o640) -> None:
    """Replace ``path`` with ``data``: temporary file, fsync, rename, fsync of the directory.

    Owner and mode are copied from ``like`` when it exists (tpu.env is root:vllm 0640).
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if like is not None and like.exists():
        st = like.stat()
        os.chown(tmp, st.st_uid, st.st_gid)
        os.chmod(tmp, st.st_mode & 0o7777)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def point_link(link: Path, target: str) -> None:
    """Atomically point the symlink ``link`` at ``target`` (a new link renamed over the old)."""
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)


def boot_id() -> str:
    return BOOT_ID.read_text().strip() if BOOT_ID.exists() else ""


class Journal:
    """The journal file and the old tpu.env saved beside it."""

    def __init__(self, state_dir: Path, env_file: Path, current_link: Path) -> None:
        self.dir = state_dir
        self.path = state_dir / "swap.json"
        self.saved_env = state_dir / "tpu.env.from"
        self.env_file = env_file
        self.current = current_link

    def read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except ValueError as exc:
            raise JournalError(f"swap journal {self.path} is unreadable: {exc}") from exc
        if data.get("phase") not in PHASES:
            raise JournalError(f"swap journal {self.path} has an unknown phase: {data.get('phase')!r}")
        return data

    def write(self, data: dict[str, Any]) -> None:
        data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_atomic(self.path, (json.dumps(data, indent=1) + "\n").encode(), mode=0o644)

    def pending(self) -> dict[str, Any]:
        """The journal of a swap not finished yet, or raise."""
        data = self.read()
        if not data or data["phase"] in DONE:
            raise JournalError(f"no swap is under way (journal {self.path})")
        return data

    def files_are_old(self, data: dict[str, Any]) -> bool:
        """``current`` and tpu.env are what the old model ran with."""
        link = os.readlink(self.current) if self.current.is_symlink() else ""
        return link == data["from_target"] and self.env_file.read_bytes() == self.saved_env.read_bytes()

    def restore(self, data: dict[str, Any]) -> bool:
        """Put back the old ``current`` and tpu.env; True when anything changed."""
        if self.files_are_old(data):
            return False
        write_atomic(self.env_file, self.saved_env.read_bytes(), like=self.env_file)
        point_link(self.current, data["from_target"])
        return True


def cmd_begin(journal: Journal, args: argparse.Namespace) -> dict[str, Any]:
    old = journal.read()
    if old and old["phase"] not in DONE:
        raise JournalError(
            f"an interrupted swap {old['from']} -> {old['to']} (phase {old['phase']}) is still "
            "in the journal; resolve it first"
        )
    if not journal.current.is_symlink():
        raise JournalError(f"{journal.current} is not a symlink: nothing is served to swap from")
    journal.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    # The old tpu.env first: the journal must never name a state it cannot restore.
    write_atomic(journal.saved_env, journal.env_file.read_bytes(), like=journal.env_file)
    data = {
        "from": args.from_key,
        "to": args.to_key,
        "from_target": os.readlink(journal.current),
        "to_target": None,
        "phase": "staging",
        "trial_boot_id": None,
        "trial_invocation": None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    journal.write(data)
    return data


def cmd_switch(journal: Journal, args: argparse.Namespace) -> dict[str, Any]:
    # The controller may vanish while this runs (a dropped SSH session sends SIGHUP): the switch
    # and the restart below must happen together or not at all.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    data = journal.pending()
    if data["phase"] != "staging":
        raise JournalError(f"switch needs phase staging, the journal is at {data['phase']}")
    target = Path(args.to_target)
    if not (target / "config.json").is_file():
        raise JournalError(f"{target} holds no checkpoint (no config.json)")
    new_env = Path(args.env_next).read_bytes()
    # Journal first: from here on the guard owns every start of the unit.
    data.update(phase="switching", to_target=str(target), trial_boot_id=boot_id())
    journal.write(data)
    write_atomic(journal.env_file, new_env, like=journal.env_file)
    point_link(journal.current, str(target))
    # A deliberate restart: a fresh count towards the unit's start limit.
    subprocess.run([args.systemctl, "reset-failed", args.unit], check=False)
    subprocess.run([args.systemctl, "restart", args.unit], check=True)
    return journal.read()


def cmd_guard(journal: Journal, args: argparse.Namespace) -> int:
    try:
        data = journal.read()
    except JournalError as exc:
        # An unreadable journal must not keep vLLM down; say so and start.
        print(f"swap-guard: {exc}; starting as configured", file=sys.stderr)
        return 0
    if not data or data["phase"] in (*DONE, "reverted", "staging"):
        return 0
    if data["phase"] == "switching" and data.get("trial_boot_id") == boot_id():
        data.update(phase="trial", trial_invocation=os.environ.get("INVOCATION_ID", ""))
        journal.write(data)
        print(
            f"swap-guard: trial start of {data['to']} (swap {data['from']} -> {data['to']})", file=sys.stderr
        )
        return 0
    why = (
        "its trial start was already used" if data["phase"] == "trial" else "it was switched in another boot"
    )
    changed = journal.restore(data)
    data.update(phase="reverted", reverted_because=f"an unverified start of {data['to']} ({why})")
    journal.write(data)
    if not changed:
        return 0
    print(
        f"swap-guard: swap {data['from']} -> {data['to']} was never committed and {why}: "
        f"current and tpu.env are back on {data['from']}; failing this start so that "
        f"systemd restarts vLLM on {data['from']}",
        file=sys.stderr,
    )
    return 1


def cmd_commit(journal: Journal, args: argparse.Namespace) -> dict[str, Any]:
    data = journal.pending()
    if data["phase"] != "trial":
        raise JournalError(
            f"commit needs phase trial (the new model started once), the journal is at {data['phase']}"
        )
    data["phase"] = "committed"
    journal.write(data)
    return data


def cmd_rollback(journal: Journal, args: argparse.Namespace) -> dict[str, Any]:
    data = journal.pending()
    # vLLM ran (or is starting) on the new files only once the swap switched them; a swap stopped
    # before that, or one the guard already reverted at a start, needs no restart.
    restart = data["phase"] in ("switching", "trial")
    was = data["phase"]
    changed = journal.restore(data)
    data.update(phase="rolled-back", rolled_back_from=was, reason=args.reason)
    journal.write(data)
    return {**data, "restart_needed": restart, "files_restored": changed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    # The rig's paths and unit name come from its configuration (the unit and the swap role pass
    # them), never from a second copy here.
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--env-file", type=Path, required=True)
    parser.add_argument("--current", type=Path, required=True)
    parser.add_argument("--unit", required=True, help="the systemd unit that serves")
    parser.add_argument("--systemctl", default="systemctl", help=argparse.SUPPRESS)  # tests
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("show")
    begin = sub.add_parser("begin")
    begin.add_argument("--from", dest="from_key", required=True)
    begin.add_argument("--to", dest="to_key", required=True)
    switch = sub.add_parser("switch")
    switch.add_argument("--to-target", required=True)
    switch.add_argument("--env-next", required=True)
    sub.add_parser("guard")
    sub.add_parser("commit")
    rollback = sub.add_parser("rollback")
    rollback.add_argument("--reason", default="")
    args = parser.parse_args(argv)
    journal = Journal(args.state_dir, args.env_file, args.current)
    try:
        if args.command == "guard":
            return cmd_guard(journal, args)
        handlers = {
            "show": lambda j, a: j.read(),
            "begin": cmd_begin,
            "switch": cmd_switch,
            "commit": cmd_commit,
            "rollback": cmd_rollback,
        }
        result = handlers[args.command](journal, args)
    except (JournalError, OSError, subprocess.CalledProcessError) as exc:
        print(f"swap_journal.py {args.command}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
