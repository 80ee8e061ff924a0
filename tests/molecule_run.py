"""Run one molecule scenario end to end from tests; its log goes under build/."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

from tests.conftest import ROOT, VENV_BIN


@dataclass
class ScenarioRun:
    """The outcome of one `molecule test` run."""

    rc: int
    output: str
    seconds: float

    @property
    def tail(self) -> str:
        """The end of the output, where a failure is told."""
        return self.output[-6000:]


def run_scenario(name: str, timeout: float = 3300) -> ScenarioRun:
    """`molecule test -s NAME` from the repository root; the log goes to build/molecule-NAME.log."""
    log = ROOT / "build" / f"molecule-{name}.log"
    log.parent.mkdir(exist_ok=True)
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "NO_COLOR": "1", "PY_COLORS": "0"}
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            [str(VENV_BIN / "molecule"), "test", "-s", name],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    seconds = time.monotonic() - started
    print(f"\nmolecule test -s {name}: rc={proc.returncode} in {seconds:.0f} s (log: {log})")
    return ScenarioRun(proc.returncode, log.read_text(errors="replace"), seconds)
