"""Run a chain of steps over a source checkpoint: plan, stream, write atomically, summarize."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
from tqdm import tqdm

from repack import __version__, int8_error, scratch, verbatim
from repack.finite import NonFiniteError
from repack.outdir import atomic_dir, check_apart, link_or_copy
from repack.st_io import CheckpointError, ShardWriter, Source
from repack.steps import Context, Step
from repack.units import Out, Unit

# Source bytes per row chunk at most. Small enough that a chunk's rows, just read, are still in
# the CPU's cache when the grid kernel's transposes read them (with 32 MiB chunks they went to
# memory and back, and a one-pass build spent about twice the system time), large enough for
# sequential reads. Each worker holds about 2.3x a chunk (rows, transposed input, packed words,
# steps).
CHUNK_BYTES = 4 * 1024 * 1024
STAMP = "repack.json"
WEIGHT_FILES = ("config.json", "model.safetensors.index.json", STAMP)


class OffGridError(Exception):
    """Some groups fit no Q4_0 grid: the input is not a QAT checkpoint (or is damaged)."""

    def __init__(self, src: Path | str, off: dict[str, int]):
        self.off = off
        worst = sorted(off.items(), key=lambda kv: (-kv[1], kv[0]))
        named = ", ".join(f"{name} ({n})" for name, n in worst[:SHOWN])
        more = f" and {len(worst) - SHOWN} more" if len(worst) > SHOWN else ""
        super().__init__(
            f"{src}: {sum(off.values())} group(s) in {len(off)} tensor(s) fit no Q4_0 grid "
            f"(not a QAT checkpoint, or damaged); nothing was written: {named}{more}"
        )


SHOWN = 5  # off-grid tensors named in the one-line message ('check' lists every one)


@dataclass
class Summary:
    tensors_converted: int = 0
    tensors_written: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    off_grid_groups: int = 0
    shards_linked: int = 0
    shards_copied: int = 0
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)
    int8_relative_error: dict | None = None  # int8 builds only: repack.int8_error.summarize

    def line(self) -> str:
        text = (
            f"{self.tensors_converted} tensors converted, {self.tensors_written} written; "
            f"{self.bytes_in / 1e6:.1f} MB in, {self.bytes_out / 1e6:.1f} MB out; "
            f"{self.off_grid_groups} off-grid groups; {self.shards_linked} shard(s) linked, "
            f"{self.shards_copied} copied; {self.seconds:.1f} s"
        )
        if self.int8_relative_error:
            text += f"; {int8_error.line(self.int8_relative_error)}"
        return text

    def record(self) -> dict:
        """What repack.json keeps under ``summary`` (a figure a build does not have is left out)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


def source_units(src: Source) -> list[Unit]:
    """One passthrough unit per source tensor, in on-disk order (sequential reads)."""
    units = []
    for info in sorted(src.tensors.values(), key=lambda t: (str(t.shard), t.start)):
        name = info.name

        def produce(start: int, stop: int, name: str = name) -> list[np.ndarray | None]:
            return [src.rows(name, start, stop, reuse=True)]

        rowwise = len(info.shape) >= 2
        nrows = info.shape[0] if rowwise else 0
        row_bytes = info.nbytes // nrows if nrows else info.nbytes
        units.append(
            Unit(
                [Out(name, info.dtype, info.shape, rowwise)],
                nrows,
                produce,
                info.shard.name,
                src=name,
                src_bytes=info.nbytes,
                row_bytes=row_bytes,
            )
        )
    return units


def default_jobs() -> int:
    """Worker threads: every CPU this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


T = TypeVar("T")
R = TypeVar("R")


def bounded_map(fn: Callable[[T], R], items: Iterable[T], jobs: int) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) in completion order, with at most ``jobs`` calls running or done-unread.

    The converters' heavy calls (pread, the numba kernels, pwrite) release the GIL, so threads
    spread them over the cores; the bound keeps memory at ``jobs`` chunks. The next item is
    taken only when a call has finished and its result has been handled, so a generator of
    items sees what its consumer did with every earlier result. The first exception cancels
    what has not started and is raised here.
    """
    if jobs <= 1:
        for it in items:
            yield it, fn(it)
        return
    todo = iter(items)
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="repack") as pool:
        pending: dict[Future, T] = {}
        try:
            while True:
                for it in itertools.islice(todo, jobs - len(pending)):
                    pending[pool.submit(fn, it)] = it
                if not pending:
                    return
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    yield pending.pop(f), f.result()
        finally:
            for f in pending:
                f.cancel()


def _copy_range(fd_in: int, off_in: int, fd_out: int, off_out: int, length: int, what: str) -> None:
    """``length`` bytes from one file to another inside the kernel (no trip through this process).

    Falls back to pread/pwrite where copy_file_range is missing or refused (old kernels,
    sandboxes such as gVisor, some network filesystems).
    """
    while length > 0:
        try:
            n = os.copy_file_range(fd_in, fd_out, min(length, 1 << 30), off_in, off_out)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                raise
            _copy_through(fd_in, off_in, fd_out, off_out, length, what)
            return
        if n == 0:
            raise OSError(f"short copy from {what}")
        off_in, off_out, length = off_in + n, off_out + n, length - n


def _copy_through(fd_in: int, off_in: int, fd_out: int, off_out: int, length: int, what: str) -> None:
    """_copy_range through a reused buffer of this process."""
    buf = scratch.array("copy", (min(length, CHUNK_BYTES),), np.uint8)
    while length > 0:
        view = memoryview(buf)[: min(length, buf.nbytes)]
        got = os.preadv(fd_in, [view], off_in)
        if got == 0:
            raise OSError(f"short copy from {what}")
        done = 0
        while done < got:
            done += os.pwrite(fd_out, view[done:got], off_out + done)
        off_in, off_out, length = off_in + got, off_out + got, length - got


def _direct(src: Source, u: Unit) -> bool:
    """True when ``u`` is a source tensor written as it is (maybe renamed): a block copy will do."""
    return u.passthrough and u.outs[0].dtype == src.tensors[u.src].dtype  # type: ignore[index]


def row_chunks(nrows: int, row_bytes: int, chunk: int) -> Iterator[tuple[int, int]]:
    """(start, stop) row ranges of at most ``chunk`` bytes (at least one row each)."""
    step = max(1, chunk // max(1, row_bytes))
    for start in range(0, nrows, step):
        yield start, min(nrows, start + step)


Task = tuple[Unit, int, int]


def _tasks(src: Source, units: list[Unit], chunk: int) -> Iterator[Task]:
    """(unit, start row, stop row) pieces of work; (unit, -1, -1) is a whole-tensor block copy."""
    for u in units:
        if _direct(src, u):
            yield u, -1, -1
        elif u.nrows == 0:
            yield u, 0, 0
        else:
            for start, stop in row_chunks(u.nrows, u.row_bytes, chunk):
                yield u, start, stop


def _task_bytes(task: Task) -> int:
    """Source bytes a task converts (what the progress bar counts)."""
    u, start, stop = task
    return u.src_bytes if stop <= 0 else u.row_bytes * (stop - start)


def spread(queues: list[list[T]], size: Callable[[T], int], running: list[int]) -> Iterator[tuple[int, T]]:
    """(queue index, item), each next item from the queue with the fewest items running, then the
    most left to do.

    ``running[i]`` counts queue i's items handed out: this generator adds one per item, and the
    consumer takes one off when an item is finished (bounded_map asks for the next item only
    after its consumer has seen every finished one).
    """
    todo = [deque(q) for q in queues]
    left = [sum(map(size, q)) for q in queues]
    while True:
        open_ = [i for i, q in enumerate(todo) if q]
        if not open_:
            return
        i = min(open_, key=lambda i: (running[i], -left[i]))
        item = todo[i].popleft()
        running[i] += 1
        left[i] -= size(item)
        yield i, item


def _write_shards(src: Source, shards: list[tuple[Path | None, list[Unit]]], bar: tqdm, jobs: int) -> None:
    """Write the output shards that hold converted tensors, all with one pool of workers.

    An entry without a path holds check units (repack.verbatim): their chunks are read and
    tested, not written, by the same workers.

    Each chunk is written at its offset as soon as it is converted. The next task comes from
    the shard with the fewest tasks running (then the most bytes left), so workers mostly
    write different files: threads writing one file take turns on its inode lock, and the
    waiting one spins (on a 2-CPU host about 9% of the CPU time of a one-pass build went there).
    """
    running = [0] * len(shards)
    writers: list[ShardWriter | None] = []

    def work(item: tuple[int, Task]) -> int:
        i, (u, start, stop) = item
        try:
            return convert(writers[i], u, start, stop)
        except NonFiniteError as exc:
            raise CheckpointError(exc.describe(src.where(u.src), max(start, 0))) from exc  # type: ignore[arg-type]

    def convert(w: ShardWriter | None, u: Unit, start: int, stop: int) -> int:
        if w is None:  # a check unit: it writes nothing, its produce raises on NaN or Inf
            u.produce(max(start, 0), stop)
        elif start < 0:
            info = src.tensors[u.src]  # type: ignore[index]
            lo, _ = w.offsets[u.outs[0].name]
            _copy_range(src.fd(info.shard), info.start, w.fd, w.data_start + lo, info.nbytes, str(info.shard))
        elif u.nrows == 0:
            for o, t in zip(u.outs, u.produce(0, 0), strict=True):
                w.write(o.name, t.reshape(o.shape))
        else:
            for o, t in zip(u.outs, u.produce(start, stop), strict=True):
                if t is not None:
                    w.write(o.name, t, start if o.rowwise else 0)
        return _task_bytes((u, start, stop))

    try:
        for path, units in shards:
            specs = [(o.name, o.dtype, o.shape) for u in units for o in u.outs]
            writers.append(None if path is None else ShardWriter(path, specs))
        tasks = spread([list(_tasks(src, units, CHUNK_BYTES)) for _, units in shards], _task_bytes, running)
        hold = _hold_after()
        # closing: on any exception here (a signal, see repack.cli), the pool stops and waits for
        # its running chunks before the writers close their files and atomic_dir removes them.
        with contextlib.closing(bounded_map(work, tasks, jobs)) as results:
            for n, ((i, _), nbytes) in enumerate(results, 1):
                running[i] -= 1
                bar.update(nbytes)
                if n == hold:
                    _hold()
    finally:
        for w in writers:
            if w is not None:
                w.close()


HOLD_ENV = "REPACK_TEST_HOLD_AFTER_CHUNKS"


def _hold_after() -> int:
    """The test hook: chunks to write before holding (0: never). Lets the tests signal or kill a
    run at a known point, mid-write, without racing a conversion that takes milliseconds."""
    try:
        return int(os.environ.get(HOLD_ENV, "0"))
    except ValueError:
        return 0


def _hold() -> None:
    """Say so on stderr, then wait for a signal (the test sends one; nothing else should set the hook)."""
    print(f"repack: holding after a chunk ({HOLD_ENV})", file=sys.stderr, flush=True)
    while True:
        signal.pause()


def _rename_copy(src: Source, shard: Path, units: list[Unit], dst: Path) -> None:
    """A shard whose tensors are only renamed: new header, data section copied as one block."""
    infos = [src.tensors[u.src] for u in units]  # type: ignore[index]
    specs = [(u.outs[0].name, i.dtype, i.shape) for u, i in zip(units, infos, strict=True)]
    w = ShardWriter(dst, specs)
    try:
        _, data = src.headers[shard]
        _copy_range(src.fd(shard), data, w.fd, w.data_start, shard.stat().st_size - data, str(shard))
    finally:
        w.close()


def _plan_shards(src: Source, units: list[Unit]) -> list[tuple[str, list[Unit]]]:
    order = [s.name for s in src.shards]
    by: dict[str, list[Unit]] = {}
    for u in units:
        by.setdefault(u.shard, []).append(u)
    return [(s, by[s]) for s in order if s in by]


def _whole_shard(src: Source, shard: str, units: list[Unit]) -> bool:
    """True when ``units`` are exactly the shard's tensors, unconverted, in on-disk order."""
    path = src.path / shard
    names = [i.name for i in sorted(src.tensors.values(), key=lambda t: t.start) if i.shard == path]
    return all(u.passthrough for u in units) and [u.src for u in units] == names


def _checks(shards: list[tuple[str, list[Unit]]]) -> list[tuple[None, list[Unit]]]:
    """Per shard, the check units of the float tensors written as they are, copied or linked
    (the quantizing kernels check the others): a NaN in a copied table is refused, not served."""
    out: list[tuple[None, list[Unit]]] = []
    for _, us in shards:
        cs = [c for c in map(verbatim.check_unit, us) if c is not None]
        if cs:
            out.append((None, cs))
    return out


def step_names(steps: list[Step]) -> list[str]:
    return [getattr(s, "__name__", "step") for s in steps]


def is_current(src_dir: Path | str, out: Path | str, steps: list[Step]) -> bool:
    """True when ``out`` was written by this version of the tools, with these steps, from this source."""
    stamp_path = Path(out) / STAMP
    try:
        stamp = json.loads(stamp_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    if not isinstance(stamp, dict):  # not a stamp these tools wrote: rebuild
        return False
    src = Source(src_dir)
    return (
        stamp.get("version") == __version__
        and stamp.get("steps") == step_names(steps)
        and stamp.get("source_fingerprint") == src.fingerprint()
    )


def run(
    src_dir: Path | str,
    out: Path | str,
    steps: list[Step],
    *,
    force: bool = False,
    quiet: bool = False,
    label: str = "",
    jobs: int | None = None,
) -> Summary:
    """Apply ``steps`` to the checkpoint in ``src_dir`` and write the result to ``out`` atomically.

    ``jobs`` worker threads convert row chunks side by side (default: every CPU).
    """
    t0 = time.monotonic()
    jobs = jobs or default_jobs()
    src = Source(src_dir)
    check_apart(out, src.path, [src.path / "config.json", *src.shards])
    ctx = Context()
    units = source_units(src)
    cfg = src.config
    for step in steps:
        try:
            units, cfg = step(units, cfg, ctx)
        except ValueError as exc:  # what a step finds wrong with its input: say which input
            raise CheckpointError(f"{src.path}: {exc}") from exc
    summary = Summary(steps=step_names(steps))
    shards = _plan_shards(src, units)
    total_in = sum(u.src_bytes for _, us in shards for u in us)
    checks = _checks(shards)
    with atomic_dir(out, force=force) as tmp:
        names = (
            ["model.safetensors"]
            if len(shards) == 1
            else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        )
        weight_map: dict[str, str] = {}
        converted: list[tuple[Path, list[Unit]]] = []
        with tqdm(
            total=total_in + sum(u.src_bytes for _, us in checks for u in us),
            unit="B",
            unit_scale=True,
            desc=label or "convert",
            disable=quiet,
            file=sys.stderr,
        ) as bar:
            for (shard, us), fname in zip(shards, names, strict=True):
                dst = tmp / fname
                if _whole_shard(src, shard, us) and all(u.unchanged for u in us):
                    link_or_copy(src.path / shard, dst)
                    summary.shards_linked += 1
                    bar.update(sum(u.src_bytes for u in us))
                elif _whole_shard(src, shard, us):
                    _rename_copy(src, src.path / shard, us, dst)
                    summary.shards_copied += 1
                    bar.update(sum(u.src_bytes for u in us))
                else:
                    converted.append((dst, us))
                for u in us:
                    weight_map.update(dict.fromkeys((o.name for o in u.outs), fname))
            _write_shards(src, [*converted, *checks], bar, jobs)
        summary.tensors_converted = sum(u.converted and u.src is not None for _, us in converted for u in us)
        summary.bytes_out = sum((tmp / fname).stat().st_size for fname in names)
        summary.bytes_in = total_in
        off = ctx.off_grid
        summary.off_grid_groups = sum(off.values())
        if off:
            raise OffGridError(src.path, off)
        summary.tensors_written = len(weight_map)
        summary.int8_relative_error = int8_error.summarize(ctx.int8_sums.per_tensor())
        if len(shards) > 1:
            index = {
                "metadata": {"total_size": summary.bytes_out},
                "weight_map": dict(sorted(weight_map.items())),
            }
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for f in sorted(src.path.iterdir()):
            if f.is_file() and f.suffix != ".safetensors" and f.name not in WEIGHT_FILES:
                shutil.copyfile(f, tmp / f.name)
        summary.seconds = time.monotonic() - t0
        stamp = {
            "tool": "gemma-rig repack",
            "version": __version__,
            "steps": summary.steps,
            "source": str(src.path.resolve()),
            "source_fingerprint": src.fingerprint(),
            "summary": summary.record(),
        }
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return summary
