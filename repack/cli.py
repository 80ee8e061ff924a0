"""What every converter CLI shares: common flags, error reporting, the closing summary."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from repack.grid import GridShapeError
from repack.outdir import OutputError
from repack.pipeline import OffGridError, Summary, run
from repack.st_io import CheckpointError
from repack.steps import Step

EXIT_OFF_GRID = 3
EXIT_ERROR = 2


def add_io(
    ap: argparse.ArgumentParser, src: str = "SRC", src_help: str = "source checkpoint directory"
) -> None:
    ap.add_argument("src", metavar=src, type=Path, help=src_help)
    ap.add_argument(
        "out", metavar="OUT", type=Path, help="output directory (written beside, renamed when complete)"
    )
    ap.add_argument("--force", action="store_true", help="replace OUT if it already exists")
    add_common(ap)


def add_common(ap: argparse.ArgumentParser) -> None:
    """--quiet and --jobs, which every tool takes."""
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    ap.add_argument(
        "-j",
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="worker threads (default: every CPU); memory stays bounded whatever N",
    )


def positive_int(text: str) -> int:
    """argparse type: an integer of 1 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {n}")
    return n


def guarded(prog: str, fn: Callable[[], int]) -> int:
    """Run ``fn``, turning the errors users can cause into one clear message and an exit code."""
    try:
        return fn()
    except OffGridError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_OFF_GRID
    except (CheckpointError, OutputError, GridShapeError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def convert(prog: str, args: argparse.Namespace, steps: list[Step]) -> int:
    """Run ``steps`` from args.src to args.out and print the closing summary."""

    def go() -> int:
        s: Summary = run(
            args.src, args.out, steps, force=args.force, quiet=args.quiet, label=prog, jobs=args.jobs
        )
        print(f"{prog}: wrote {args.out}: {s.line()}")
        return 0

    return guarded(prog, go)
