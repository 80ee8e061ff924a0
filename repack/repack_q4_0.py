#!/usr/bin/env python3
"""Google's Gemma 4 QAT release -> compressed-tensors W4A16, a grid report, or any build in one pass.

python repack/repack_q4_0.py repack SRC OUT            # linears -> W4A16 (towers kept, ignored)
python repack/repack_q4_0.py check SRC                 # grid report, writes nothing
python repack/repack_q4_0.py build SRC OUT --target emb4|text|w4a16|w8a8
python repack/repack_q4_0.py --list-targets            # those targets, one a line
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repack import cli, grid
from repack.finite import NonFiniteError
from repack.st_io import CheckpointError, Source
from repack.steps import EMBED, LINEAR, STEPS, Context, TensorStats, check_weight, repack

PROG = "repack_q4_0.py"


def check(src_dir: Path, quiet: bool, jobs: int | None = None) -> int:
    """Print groups, off-grid groups and worst error per quantizable tensor and in total."""
    from tqdm import tqdm

    from repack.pipeline import CHUNK_BYTES, bounded_map, default_jobs, row_chunks

    src = Source(src_dir)
    names = [n for n in sorted(src.tensors) if LINEAR.match(n) or EMBED.match(n)]
    if not names:
        raise ValueError(f"{src_dir}: no language-model linears or embedding tables to check")
    try:
        for name in names:
            check_weight(name, src.tensors[name].dtype, src.tensors[name].shape)
            grid.check_group_shape(name, src.tensors[name].shape)
    except ValueError as exc:  # named as the converters name it: which source, which tensor
        raise CheckpointError(f"{src.path}: {exc}") from exc
    jobs = jobs or default_jobs()
    row_bytes = {n: src.tensors[n].nbytes // max(1, src.tensors[n].shape[0]) for n in names}
    tasks = [
        (n, a, b) for n in names for a, b in row_chunks(src.tensors[n].shape[0], row_bytes[n], CHUNK_BYTES)
    ]

    def one(task: tuple[str, int, int]) -> grid.GridResult:
        name, start, stop = task
        try:
            return grid.recover_array(
                src.rows(name, start, stop, reuse=True), src.tensors[name].dtype, reuse=True, levels=False
            )
        except NonFiniteError as exc:
            raise CheckpointError(exc.describe(src.where(name), start)) from exc

    ctx = Context()
    total = sum(src.tensors[n].nbytes for n in names)
    with tqdm(total=total, unit="B", unit_scale=True, desc="check", disable=quiet, file=sys.stderr) as bar:
        for (name, start, stop), r in bounded_map(one, tasks, jobs):
            ctx.record(name, r)
            bar.update(row_bytes[name] * (stop - start))
    stats = [(n, ctx.stats.get(n, TensorStats())) for n in names]
    print(f"{'tensor':<72} {'groups':>12} {'off-grid':>9} {'max err':>10} {'err/step':>9}")
    for name, t in stats:
        print(f"{name:<72} {t.groups:>12} {t.off_grid:>9} {t.max_abs_error:>10.3g} {t.max_step_error:>9.3g}")
    total_groups = sum(t.groups for _, t in stats)
    total_off = sum(t.off_grid for _, t in stats)
    worst = max(t.max_abs_error for _, t in stats)
    print(f"{'TOTAL':<72} {total_groups:>12} {total_off:>9} {worst:>10.3g}")
    if total_off:
        bad = sum(1 for _, t in stats if t.off_grid)
        print(
            f"{PROG}: error: {src.path}: {total_off} group(s) in {bad} tensor(s) fit no Q4_0 grid (listed above)",
            file=sys.stderr,
        )
        return cli.EXIT_OFF_GRID
    return 0


class ListTargets(argparse.Action):
    """``--list-targets``: print the build targets, one a line, and exit (like ``--version``).

    The Ansible side reads them from here (plugins/lookup/rig_catalog.py) instead of retyping them.
    """

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print("\n".join(sorted(STEPS)))
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Recover the Q4_0 grid of Google's Gemma 4 QAT release (bf16 values on a 4-bit grid, "
        "groups of 32) and write compressed-tensors checkpoints from it, losslessly. Never re-quantizes: "
        "any group that fits no grid aborts the run with the tensor names, leaving no OUT.",
    )
    ap.add_argument(
        "--list-targets",
        action=ListTargets,
        help="print the build targets of `build --target`, one a line, and exit",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser(
        "repack", help="every language-model linear -> W4A16 pack-quantized (towers kept, ignored)"
    )
    cli.add_io(p)
    p = sub.add_parser("check", help="grid report per tensor and in total; writes nothing")
    p.add_argument("src", metavar="SRC", type=Path, help="source checkpoint directory")
    cli.add_common(p)
    p = sub.add_parser("build", help="one pass from the QAT source to a served build, reading it once")
    cli.add_io(p)
    p.add_argument(
        "--target",
        required=True,
        choices=sorted(STEPS),
        help="emb4: text-only, int4 embeddings + untied int4 lm_head; text: text-only W4A16; "
        "w4a16: multimodal W4A16; w8a8: text-only int8",
    )
    p.add_argument(
        "--if-stale",
        action="store_true",
        help="do nothing (and say 'up to date') when OUT's repack.json records this source, target and "
        "tool version; otherwise rebuild (implies --force)",
    )
    p.add_argument(
        "--status", action="store_true", help="print 'current' or 'stale' for OUT and exit; writes nothing"
    )
    args = ap.parse_args(argv)
    if args.cmd == "check":
        return cli.guarded(PROG, lambda: check(args.src, args.quiet, args.jobs))
    if args.cmd == "repack":
        return cli.convert(PROG, args, [repack])
    steps = STEPS[args.target]
    if args.status or args.if_stale:
        from repack.pipeline import is_current

        current = cli.guarded(PROG, lambda: int(is_current(args.src, args.out, steps)))
        if current not in (0, 1):
            return current
        if args.status:
            print("current" if current else "stale")
            return 0
        if current:
            print(f"{PROG}: {args.out} is up to date")
            return 0
        args.force = True
    return cli.convert(f"{PROG} build --target {args.target}", args, steps)


if __name__ == "__main__":
    sys.exit(main())
