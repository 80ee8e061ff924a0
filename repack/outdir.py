"""Atomic output directories: build beside OUT, rename into place only when complete."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


class OutputError(Exception):
    """OUT exists without --force, or cannot be written."""


def _check_writable(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise OutputError(f"{out} already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {out}: parent directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {out}: parent directory {parent} is not writable")


@contextlib.contextmanager
def atomic_dir(out: Path | str, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``out``; on success it replaces ``out``.

    On any exception the temporary directory is removed and ``out`` is left as it was, so a
    failed run never leaves a half-written checkpoint.
    """
    out = Path(out)
    _check_writable(out, force)
    parent = out.resolve().parent
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
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.rename(out, old / "x")
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
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
