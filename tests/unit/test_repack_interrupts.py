"""Runs stopped midway leave nothing behind: signals, SIGKILL, a concurrent run, a full disk.

The converter runs in a subprocess, as a user runs it. To stop it at a known point without
racing a conversion that takes milliseconds, the test hook REPACK_TEST_HOLD_AFTER_CHUNKS=1
makes it write one chunk into its temporary directory, say so on stderr, and wait; the test
reads that line, checks the temporary directory is there, then signals.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from repack.pipeline import HOLD_ENV
from tests.unit.repack_micro import write_micro_qat

ROOT = Path(__file__).resolve().parents[2]
TOOL = [sys.executable, str(ROOT / "repack" / "repack_q4_0.py"), "build"]
PROG = "repack_q4_0.py build --target w8a8"


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sig") / "micro"
    write_micro_qat(d)
    return d


def _temporaries(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def _start(src: Path, out: Path, hold: bool = True) -> subprocess.Popen:
    env = {**os.environ, HOLD_ENV: "1" if hold else "0"}
    return subprocess.Popen(
        [*TOOL, str(src), str(out), "--target", "w8a8", "-q", "-j", "2"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _held(p: subprocess.Popen) -> None:
    """Wait until the run holds mid-write (its temporary directory has a chunk in it)."""
    seen = []
    for line in p.stderr:  # until the hold line (anything before it, a warning say, is kept for the failure)
        seen.append(line)
        if "holding after a chunk" in line:
            return
    raise AssertionError("the run ended without holding: " + "".join(seen))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_removes_the_temporary_and_exits_128_plus_n(sig, micro, tmp_path):
    out = tmp_path / "out"
    p = _start(micro, out)
    try:
        _held(p)
        assert len(_temporaries(tmp_path)) == 1  # the run is mid-write
        p.send_signal(sig)
        rest = p.communicate(timeout=60)[1]
    finally:
        p.kill()
    assert p.returncode == 128 + sig
    assert rest.strip().splitlines() == [
        f"{PROG}: interrupted by {signal.Signals(sig).name}; stopped, no partial output left"
    ]
    assert _temporaries(tmp_path) == [] and not out.exists()


def test_a_killed_runs_temporary_is_removed_by_the_next_run(micro, tmp_path):
    out = tmp_path / "out"
    p = _start(micro, out)
    try:
        _held(p)
        p.kill()
        p.wait(timeout=60)
    finally:
        p.kill()
    left = _temporaries(tmp_path)
    assert len(left) == 1 and (tmp_path / left[0] / "model.safetensors").exists()  # SIGKILL cannot clean up
    done = subprocess.run(
        [*TOOL, str(micro), str(out), "--target", "w8a8", "-q"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert _temporaries(tmp_path) == [] and (out / "config.json").exists()


def test_a_concurrent_run_refuses_and_leaves_the_first_ones_work_alone(micro, tmp_path):
    out = tmp_path / "out"
    first = _start(micro, out)
    try:
        _held(first)
        mine = _temporaries(tmp_path)
        second = _start(micro, out, hold=False)
        err = second.communicate(timeout=60)[1]
        assert second.returncode == 2
        assert err.strip().splitlines() == [
            f"{PROG}: error: {out} is being written by another run (pid {first.pid}, lock "
            f"{tmp_path / '.out.lock'}); wait for it or stop it"
        ]
        assert _temporaries(tmp_path) == mine  # the live run's temporary is not a leftover
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 128 + signal.SIGTERM and not out.exists()


def test_a_file_size_limit_names_out(micro, tmp_path):
    """A write the output's filesystem refuses (here EFBIG, from RLIMIT_FSIZE; ENOSPC takes the
    same path) names OUT and leaves nothing."""
    import resource

    out = tmp_path / "out"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # Python ignores SIGXFSZ

    r = subprocess.run(
        [*TOOL, str(micro), str(out), "--target", "w8a8", "-q"],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"{PROG}: error: cannot write {out}: File too large; nothing was written"
    ]
    assert _temporaries(tmp_path) == [] and not out.exists()


def test_a_full_disk_names_out(micro, tmp_path):
    """ENOSPC for real: OUT on a 40 KiB tmpfs in a private mount namespace (skipped where
    user namespaces are not allowed)."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip("user namespaces not allowed here")
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "out"
    script = (
        f"mount -t tmpfs -o size=40k tmpfs {disk} && exec {' '.join(TOOL)} {micro} {out} --target w8a8 -q"
    )
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"{PROG}: error: cannot write {out}: No space left on device; nothing was written"
    ]


def test_a_signal_during_the_swap_of_out_waits_until_out_is_in_place(tmp_path, monkeypatch):
    """SIGTERM right after OUT was moved aside: the new OUT still goes in place, then the run
    stops with 128 + 15 (cut there, neither the old nor the new OUT would be at OUT)."""
    from repack import cli, outdir

    out = tmp_path / "out"
    out.mkdir()
    (out / "old").write_text("old")
    real, sent = os.rename, []

    def rename(a, b):  # the real rename, then a real signal to this process after the first
        real(a, b)
        if not sent:
            sent.append(a)
            os.kill(os.getpid(), signal.SIGTERM)

    def go() -> int:
        with outdir.atomic_dir(out, force=True) as tmp:
            (tmp / "new").write_text("new")
            monkeypatch.setattr(outdir.os, "rename", rename)
        return 0

    assert cli.guarded("tool.py", go) == 128 + signal.SIGTERM
    assert sent == [out]
    assert sorted(p.name for p in out.iterdir()) == ["new"]
    assert _temporaries(tmp_path) == []
