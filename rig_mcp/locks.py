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
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


class Busy(Exception):
    """Another mutating call holds one of the rigs."""


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
                record = json.loads(path.read_text() or "null")
            except (OSError, ValueError):
                record = None
            if record:
                return f"busy: {record['what']} since {record['since']}"
            time.sleep(0.05)
        return f"busy: another call holds {path.stem}"

    @contextlib.contextmanager
    def hold(self, rigs: Iterable[str], what: str) -> Iterator[None]:
        """Hold every rig in ``rigs`` (all or none) for the call described by ``what``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        since = time.strftime("%H:%M", time.localtime(self.clock()))
        record = json.dumps({"what": what, "since": since, "pid": os.getpid()})
        held: list[int] = []
        try:
            # Sorted, so two calls over overlapping rigs cannot each hold one the other wants.
            for rig in sorted(set(rigs)):
                path = self.directory / f"{_safe(rig)}.lock"
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
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
