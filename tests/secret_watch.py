"""Watch every process's command line while a play runs, for secrets that must never show there."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType


class CmdlineSampler:
    """Read /proc/*/cmdline over and over in a thread; remember any that holds a secret.

    ``seen`` keeps every command line read (secrets masked), so a test can show the sampler did see
    the processes that handled the secret (the play's own helpers), not just an idle machine.
    """

    def __init__(self, secrets: list[str], interval_s: float = 0.005) -> None:
        self.secrets = [s.encode() for s in secrets if s]
        self.interval_s = interval_s
        self.hits: list[str] = []
        self.seen: set[str] = set()
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) == me:
                    continue
                try:
                    raw = (entry / "cmdline").read_bytes()
                except OSError:  # gone, or a kernel thread
                    continue
                text = raw.replace(b"\0", b" ")
                masked = text
                for secret in self.secrets:
                    if secret in text:
                        masked = masked.replace(secret, b"<SECRET>")
                        self.hits.append(masked.decode(errors="replace"))
                self.seen.add(masked.decode(errors="replace"))
            self.rounds += 1
            self._stop.wait(self.interval_s)

    def saw(self, needle: str) -> bool:
        """True when some command line read contained ``needle``."""
        return any(needle in line for line in self.seen)

    def __enter__(self) -> CmdlineSampler:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
