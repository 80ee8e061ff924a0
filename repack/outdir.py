"""Atomic output directories: build beside OUT, rename into place only when complete.

Beside OUT live, for the length of a run, a temporary directory (``.OUT.tmp-XXXXXXXX``) and a
lock file (``.OUT.lock``, kept: removing a lock file lets two runs each hold "the" lock).
While a run holds the lock no other run may write OUT, so whatever temporary directory the
lock's holder finds beside OUT was left by a run that died without cleaning up (SIGKILL, a power
cut) and is removed. SIGTERM, SIGHUP and SIGINT are handled by the CLIs (repack.cli), which turn
them into Interrupted, an exception that passes through here, so the temporary directory goes
with it; during the swap of OUT itself they wait until it is done.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

# What makes the output's filesystem refuse a write: the message then names OUT, since the
# temporary directory lies on OUT's filesystem (reads never fail this way).
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
HANDLED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # what repack.cli turns into Interrupted


class OutputError(Exception):
    """OUT exists without --force, cannot be written, overlaps the source, or is being written."""


def _check_writable(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise OutputError(f"{out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory")
    parent = out.resolve().parent
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"cannot write {out}: its parent {parent} is not a directory")
    if not parent.is_dir():
        raise OutputError(f"cannot write {out}: parent directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {out}: parent directory {parent} is not writable")


def _inside(a: Path, b: Path) -> bool:
    """True when ``a`` is ``b`` or lies under it (both resolved)."""
    return a == b or b in a.parents


def check_apart(out: Path | str, src: Path | str, files: Iterable[Path] = ()) -> None:
    """Refuse an OUT that is the source, lies inside it or holds it, or holds one of its ``files``.

    Paths are compared resolved, so symbolic links do not hide an overlap (a source whose shards
    link into OUT, as a Hugging Face cache snapshot links into its blobs, counts). With
    ``--force`` such an OUT would be replaced by the conversion of itself: the source lost.
    """
    o, s = Path(out).resolve(), Path(src).resolve()
    if _inside(o, s) or _inside(s, o):
        how = "is" if o == s else "lies inside" if _inside(o, s) else "holds"
        raise OutputError(f"{out} {how} the source {src}; write the output somewhere else")
    for f in files:
        if _inside(f.resolve(), o):
            raise OutputError(f"{out} holds {f.resolve()}, a file of the source {src} (through a link)")


def lock_path(out: Path) -> Path:
    return out.resolve().parent / f".{out.name}.lock"


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold an exclusive flock on OUT's lock file; refuse at once if another run holds it."""
    path = lock_path(out)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputError(f"cannot write {out}: cannot open its lock file {path}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise OutputError(
                f"{out} is being written by another run (pid {holder}, lock {path}); wait for it or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


_LEFTOVER = r"\.{name}\.(?:tmp|old)-[a-z0-9_]{{8}}"  # mkdtemp's suffix: 8 of [a-z0-9_]


def remove_leftovers(out: Path) -> list[Path]:
    """Remove what dead runs left beside OUT (call only while holding OUT's lock)."""
    pattern = re.compile(_LEFTOVER.format(name=re.escape(out.name)))
    gone = []
    for p in out.resolve().parent.iterdir():
        if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


class Interrupted(BaseException):
    """A handled signal arrived (see repack.cli). A BaseException, so that no ``except
    Exception`` on the way swallows it; every ``finally``, and atomic_dir's cleanup, run as it
    passes."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


_swap = {"active": False, "pending": 0}  # main thread only: the signal handlers run there


def interrupt(signum: int) -> None:
    """What the CLIs' signal handler calls: raise Interrupted now, or, while OUT is being
    swapped into place, once the swap is done (a swap cut short would leave OUT moved away
    and the new one not in place)."""
    if _swap["active"]:
        _swap["pending"] = signum
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def _swapping() -> Iterator[None]:
    _swap["active"], _swap["pending"] = True, 0
    try:
        yield
    finally:
        _swap["active"] = False
    if _swap["pending"]:
        raise Interrupted(_swap["pending"])


@contextlib.contextmanager
def atomic_dir(out: Path | str, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``out``; on success it replaces ``out``.

    On any exception (signals included, see repack.cli) the temporary directory is removed and
    ``out`` is left as it was, so a failed run never leaves a half-written checkpoint. A full
    disk is reported naming OUT.
    """
    out = Path(out)
    _check_writable(out, force)
    parent = out.resolve().parent
    with _locked(out):
        _check_writable(out, force)  # again: a run that held the lock may just have made OUT
        remove_leftovers(out)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
        except OSError as exc:
            raise OutputError(f"cannot write {out}: {exc}") from exc
        try:
            yield tmp
            # mkdtemp (and safetensors) create private modes; a checkpoint is meant to be read by others.
            os.chmod(tmp, 0o755)
            for f in tmp.rglob("*"):
                if f.is_file() and not f.is_symlink():
                    os.chmod(f, 0o644)
            with _swapping():
                if out.exists():
                    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
                    os.rename(out, old / "x")
                    os.rename(tmp, out)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.rename(tmp, out)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno in FULL:
                raise OutputError(
                    f"cannot write {out}: {os.strerror(exc.errno)}; nothing was written"
                ) from exc
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def link_or_copy(src: Path, dst: Path) -> str:
    """Hard-link ``src`` to ``dst``; copy when they are on different filesystems. Returns 'link' or 'copy'."""
    try:
        os.link(src, dst)
        return "link"
    except OSError:
        shutil.copyfile(src, dst)
        return "copy"
