"""One mutating call at a time per rig, across every server process on this controller.

Each rig has a lock file; a mutating call holds an exclusive flock on it and writes what it is
doing into it, so a second caller (in this process or another) is refused at once with
"busy: swap of rig-local to tiny-w8a8 since 12:03". flock locks belong to an open file
description, so two opens in one process exclude each other just as two processes do, and the
kernel drops a lock when its holder dies: no stale locks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


class Busy(Exception):
    """Another mutating call holds one of the rigs."""


class UnsafeLockDir(Exception):
    """The lock directory is not ours alone: a symlink, another user's, or writable by others."""


def default_lock_dir() -> Path:
    """A directory only this user can write: $XDG_RUNTIME_DIR/gemma-rig-mcp when that runtime
    directory is ours, else ~/.cache/gemma-rig/mcp-locks. Never a fixed name in a shared /tmp,
    where anyone can plant it first (a symlink, or a directory they own)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.lstat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            return Path(runtime) / "gemma-rig-mcp"
    return Path.home() / ".cache" / "gemma-rig" / "mcp-locks"


def private_dir(directory: Path, what: str = "lock directory") -> Path:
    """``directory``, created 0700 when missing, checked to be a real directory (not a symlink),
    owned by this user and not writable by group or others; UnsafeLockDir (one line, naming it
    ``what``) otherwise."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeLockDir(f"{what} {directory} is not a directory (a symlink?): refused; remove it")
    if st.st_uid != os.geteuid():
        raise UnsafeLockDir(
            f"{what} {directory} is owned by uid {st.st_uid}, not {os.geteuid()}: refused; remove it"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeLockDir(
            f"{what} {directory} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"refused; chmod 700 it"
        )
    return directory


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class RigLocks:
    """Per-rig exclusive locks in ``directory``."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.time) -> None:
        self.directory = Path(directory)
        self.clock = clock

    def _holder(self, path: Path) -> str:
        # The holder writes its record right after it locks; a reader may land in between.
        for _ in range(20):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    record = json.loads(f.read(4096) or b"null")
            except (OSError, ValueError):
                record = None
            if record:
                return f"busy: {record['what']} since {record['since']}"
            time.sleep(0.05)
        return f"busy: another call holds {path.stem}"

    @contextlib.contextmanager
    def hold(self, rigs: Iterable[str], what: str) -> Iterator[None]:
        """Hold every rig in ``rigs`` (all or none) for the call described by ``what``."""
        private_dir(self.directory)
        since = time.strftime("%H:%M", time.localtime(self.clock()))
        record = json.dumps({"what": what, "since": since, "pid": os.getpid()})
        held: list[int] = []
        try:
            # Sorted, so two calls over overlapping rigs cannot each hold one the other wants.
            for rig in sorted(set(rigs)):
                path = self.directory / f"{_safe(rig)}.lock"
                try:
                    # O_NOFOLLOW: a lock file planted as a symlink is refused, never followed.
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                except OSError as exc:
                    raise UnsafeLockDir(
                        f"lock file {path} cannot be opened safely ({exc.strerror}): refused"
                    ) from None
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise UnsafeLockDir(f"lock file {path} is not a regular file: refused; remove it")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    raise Busy(self._holder(path)) from None
                held.append(fd)
                os.ftruncate(fd, 0)
                os.pwrite(fd, record.encode(), 0)
            yield
        finally:
            for fd in held:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
