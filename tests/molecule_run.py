"""Run molecule scenarios from tests; each one's log goes to build/molecule-NAME.log.

A scenario converges its own container and shares nothing with the e2e rig, and it mostly waits on
pip and podman, while the e2e tests mostly wait on vLLM: `start_early` queues the selected scenarios
when collection ends, and `release_early` runs them, one after another, in a background thread:
at once without e2e tests, else once the e2e's cold site.yml is done (tests/e2e/conftest.py), since
that bring-up downloads and installs as the scenarios do. Each scenario's test then waits for its
run instead of starting one (and releases the queue itself if nothing did). The test still asserts
on that run's whole output; only its reported duration shrinks, by the time the run overlapped
other tests. RIG_MOLECULE_EARLY=0 turns this off (each test then runs its scenario itself).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field

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


@dataclass
class _Early:
    """Scenarios started at collection: their results as they finish, and the one running."""

    names: list[str]
    results: dict[str, ScenarioRun] = field(default_factory=dict)
    done: dict[str, threading.Event] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    stopped: bool = False
    released: bool = False
    timeout: float = 3300


_early: _Early | None = None


def _run(name: str, timeout: float, keep: _Early | None = None) -> ScenarioRun:
    log = ROOT / "build" / f"molecule-{name}.log"
    log.parent.mkdir(exist_ok=True)
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "NO_COLOR": "1", "PY_COLORS": "0"}
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(VENV_BIN / "molecule"), "test", "-s", name],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        if keep is not None:
            keep.proc = proc
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            out.write(f"\nmolecule test -s {name}: killed after {timeout:.0f} s\n")
    return ScenarioRun(rc, log.read_text(errors="replace"), time.monotonic() - started)


def start_early(names: list[str], timeout: float = 3300, now: bool = True) -> None:
    """Queue ``names`` to run one after another in a background thread: from now, or (``now``
    false) from `release_early`."""
    global _early
    _early = _Early(list(names), done={n: threading.Event() for n in names}, timeout=timeout)
    if now:
        release_early()


def release_early() -> None:
    """Start the queued scenarios (once; nothing when none are queued)."""
    early = _early
    if early is None or early.released:
        return
    early.released = True

    def work() -> None:
        for name in early.names:
            if early.stopped:
                break
            early.results[name] = _run(name, early.timeout, keep=early)
            early.done[name].set()

    threading.Thread(target=work, name="molecule-early", daemon=True).start()


def stop_early() -> None:
    """Stop a scenario still running when the session ends (a -x stop, an interrupt)."""
    if _early is None:
        return
    _early.stopped = True
    if _early.proc is not None and _early.proc.poll() is None:
        _early.proc.terminate()
        try:
            _early.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _early.proc.kill()


def run_scenario(name: str, timeout: float = 3300) -> ScenarioRun:
    """`molecule test -s NAME`'s outcome: the early run's when one was started, else a run now."""
    waited = time.monotonic()
    if _early is not None and name in _early.done:
        release_early()
        if not _early.done[name].wait(timeout):
            raise TimeoutError(f"molecule test -s {name} (started early) did not finish in {timeout:.0f} s")
        result = _early.results[name]
        how = f"started at collection, waited {time.monotonic() - waited:.0f} s for it"
    else:
        result = _run(name, timeout)
        how = "run here"
    print(
        f"\nmolecule test -s {name}: rc={result.rc} in {result.seconds:.0f} s ({how}; log: build/molecule-{name}.log)"
    )
    return result
