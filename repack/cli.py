"""What every converter CLI shares: common flags, error reporting, the closing summary."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from repack.grid import GridShapeError
from repack.outdir import HANDLED, Interrupted, OutputError, interrupt
from repack.pipeline import OffGridError, Summary, run
from repack.st_io import CheckpointError
from repack.steps import Step

EXIT_OFF_GRID = 3
EXIT_ERROR = 2
EXIT_INTERNAL = 1  # not expected: a bug (the bad-input tests hold every case to 2 or 3)


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


# Each worker is a thread holding a few row chunks; past this, more threads only add memory
# and contention (a typo like -j 4000 would ask for 40 GiB).
MAX_JOBS = 256


def positive_int(text: str) -> int:
    """argparse type: a worker count from 1 to MAX_JOBS."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {n}")
    if n > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"must be {MAX_JOBS} or fewer, got {n}")
    return n


def _on_signal(signum: int, frame: object) -> None:
    del frame
    for s in HANDLED:  # a second signal must not cut the cleanup short
        signal.signal(s, signal.SIG_IGN)
    interrupt(signum)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def guarded(prog: str, fn: Callable[[], int]) -> int:
    """Run ``fn``, turning every error into one line on stderr and an exit code: no traceback.

    SIGTERM, SIGHUP and SIGINT stop the run (the temporary output goes with it) and exit with
    128 + the signal's number. Errors the tools do not expect get EXIT_INTERNAL and say so.
    """
    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, _on_signal) for s in HANDLED} if main else {}
    try:
        return fn()
    except Interrupted as exc:
        print(f"{prog}: interrupted by {exc}; stopped, no partial output left", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:  # SIGINT before the handler was installed
        print(f"{prog}: interrupted by SIGINT; stopped, no partial output left", file=sys.stderr)
        return 128 + signal.SIGINT
    except OffGridError as exc:
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_OFF_GRID
    except (CheckpointError, OutputError, GridShapeError, ValueError, OSError) as exc:
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # the last resort: a bug, still one line, no traceback
        print(
            f"{prog}: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug; please report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def convert(prog: str, args: argparse.Namespace, steps: list[Step]) -> int:
    """Run ``steps`` from args.src to args.out and print the closing summary."""

    def go() -> int:
        s: Summary = run(
            args.src, args.out, steps, force=args.force, quiet=args.quiet, label=prog, jobs=args.jobs
        )
        print(f"{prog}: wrote {args.out}: {s.line()}")
        return 0

    return guarded(prog, go)
