"""The converters' worker threads: same bytes whatever the job count, bounded, errors surface."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from repack import pipeline, repack_q4_0
from repack.make_tiny_qat import build
from repack.pipeline import bounded_map, run, spread
from repack.steps import STEPS


@pytest.fixture(scope="module")
def qat(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("workers") / "qat"
    # Untrained: the converters' bytes are the point here, and a run trains one seed only.
    build(d, seed=3, with_shared_kv=False, force=False, train=False)
    return d


def _digests(d: Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(d.iterdir())
        if f.suffix == ".safetensors"
    }


@pytest.mark.parametrize("target", sorted(STEPS))
def test_every_job_count_writes_the_same_bytes(qat, tmp_path, monkeypatch, target):
    # Small chunks, so every tensor is split over several workers and chunks finish out of order.
    monkeypatch.setattr(pipeline, "CHUNK_BYTES", 4096)
    serial = run(qat, tmp_path / "j1", STEPS[target], quiet=True, jobs=1)
    parallel = run(qat, tmp_path / "j4", STEPS[target], quiet=True, jobs=4)
    assert _digests(tmp_path / "j1") == _digests(tmp_path / "j4")
    assert (tmp_path / "j1" / "config.json").read_text() == (tmp_path / "j4" / "config.json").read_text()
    assert serial.tensors_converted == parallel.tensors_converted > 0
    assert serial.bytes_out == parallel.bytes_out


def test_check_reports_the_same_with_any_job_count(qat, capsys):
    assert repack_q4_0.main(["check", str(qat), "-q", "-j", "1"]) == 0
    one = capsys.readouterr().out
    assert repack_q4_0.main(["check", str(qat), "-q", "--jobs", "3"]) == 0
    assert capsys.readouterr().out == one
    assert "TOTAL" in one


def test_jobs_must_be_positive(qat, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        repack_q4_0.main(["build", str(qat), str(tmp_path / "o"), "--target", "emb4", "-j", "0"])
    assert exc.value.code == 2
    assert "must be 1 or more" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_bounded_map_keeps_at_most_jobs_running_and_yields_everything():
    # No sleeps: a barrier of `jobs` parties makes every call wait until `jobs` calls are inside
    # at once, so the test completes only if bounded_map really runs `jobs` side by side (a
    # serial map breaks the barrier: its timeout is a deadlock guard, not a measurement). The
    # bound is counted where it is decided: items pulled from the source minus results handled.
    jobs, n = 3, 39  # a multiple of jobs, so the last round of the barrier fills too
    barrier = threading.Barrier(jobs, timeout=60)
    lock = threading.Lock()
    running = peak = pulled = handled = 0
    in_flight_at_pull: list[int] = []

    def items():
        nonlocal pulled
        for i in range(n):
            pulled += 1
            in_flight_at_pull.append(pulled - handled)
            yield i

    def work(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        barrier.wait()
        with lock:
            running -= 1
        return i * i

    got = {}
    for i, sq in bounded_map(work, items(), jobs):
        got[i] = sq
        handled += 1
    assert got == {i: i * i for i in range(n)}
    assert max(in_flight_at_pull) == jobs  # never more than jobs taken and not yet handled
    assert peak == jobs  # the barrier needs jobs inside at once; the pool allows no more


def test_bounded_map_raises_the_first_error_and_stops_submitting(monkeypatch):
    # No sleeps: item 1 finishes only after item 0's failure is recorded in its future, so the
    # first wait in bounded_map always sees the failure; from then on no item may be taken.
    futures = []

    class Recording(pipeline.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            futures.append(super().submit(fn, *args, **kwargs))
            return futures[-1]

    monkeypatch.setattr(pipeline, "ThreadPoolExecutor", Recording)
    pulled = []

    def items():
        for i in range(1000):
            pulled.append(i)
            yield i

    def work(i: int) -> int:
        if i == 0:
            raise ValueError("chunk 0 is bad")
        futures[0].exception(timeout=60)  # waits for item 0's future; the timeout guards a hang
        return i

    with pytest.raises(ValueError, match="chunk 0 is bad"):
        for _ in bounded_map(work, items(), 2):
            pass
    assert pulled == [0, 1]  # the two first slots, and nothing after the failure


def test_bounded_map_takes_the_next_item_only_after_a_finished_one_was_handled():
    # spread() picks each next task from what the consumer has seen finish, so the item
    # source must not run ahead of the consumer.
    handled: list[int] = []
    seen_at_pull: list[int] = []

    def items():
        for i in range(12):
            seen_at_pull.append(len(handled))
            yield i

    for it, _ in bounded_map(lambda i: i, items(), 3):
        handled.append(it)
    assert seen_at_pull[:3] == [0, 0, 0]  # the first jobs items start at once
    assert all(seen >= i - 2 for i, seen in enumerate(seen_at_pull))  # then one per handled result


def test_spread_gives_each_running_slot_a_different_queue_and_refills_the_one_freed():
    running = [0, 0, 0]
    queues = [[("a", 1)] * 3, [("b", 5)] * 3, [("c", 2)] * 2]
    picks = spread(queues, lambda item: item[1], running)
    first = [next(picks)[0] for _ in range(3)]
    assert first == [1, 2, 0]  # every queue has one running, the most bytes left first
    running[2] -= 1  # a "c" item finished: the next comes from that queue again
    assert next(picks) == (2, ("c", 2))
    running[0] -= 1
    running[1] -= 1  # ties on running: the queue with more left ("b": 10 bytes against "a": 2)
    assert next(picks)[0] == 1
    rest = list(picks)
    assert sorted(i for i, _ in rest) == [0, 0, 1]
    assert running == [2, 2, 1]  # every item handed out counted, minus the three finished


@pytest.fixture(scope="module")
def qat_split(qat, tmp_path_factory) -> Path:
    """The same checkpoint with its language model in two shards: three in all."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("split") / "qat"
    shutil.copytree(qat, d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    lm = "model-00001-of-00002.safetensors"
    tensors = load_file(d / lm)
    names = sorted(tensors)
    halves = {"model-lm-a.safetensors": names[::2], "model-lm-b.safetensors": names[1::2]}
    for fname, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(d / fname), metadata={"format": "pt"})
        index["weight_map"].update(dict.fromkeys(part, fname))
    (d / lm).unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def _tensors(d: Path) -> dict[str, bytes]:
    """Every tensor of a checkpoint directory, by name, as raw bytes (whatever its shard)."""
    import torch
    from safetensors import safe_open

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open has no __iter__
                out[name] = st.get_tensor(name).contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return out


@pytest.mark.parametrize("target", ["emb4", "w4a16"])
def test_shards_converted_side_by_side_hold_the_same_tensors(qat, qat_split, tmp_path, monkeypatch, target):
    # Workers take chunks of several output shards at once; every tensor still gets its bytes.
    monkeypatch.setattr(pipeline, "CHUNK_BYTES", 4096)
    run(qat, tmp_path / "two", STEPS[target], quiet=True, jobs=1)
    run(qat_split, tmp_path / "three", STEPS[target], quiet=True, jobs=4)
    one, many = _tensors(tmp_path / "two"), _tensors(tmp_path / "three")
    assert one.keys() == many.keys()
    assert [n for n in one if one[n] != many[n]] == []
    assert len(list((tmp_path / "three").glob("*.safetensors"))) > len(
        list((tmp_path / "two").glob("*.safetensors"))
    )


def test_block_copies_fall_back_when_copy_file_range_is_refused(qat, tmp_path, monkeypatch):
    # Sandboxes (gVisor) and some filesystems refuse copy_file_range: the copy goes through
    # this process instead, with the same bytes.
    import errno
    import os

    run(qat, tmp_path / "native", STEPS["text"], quiet=True, jobs=2)
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise OSError(errno.ENOSYS, "copy_file_range not supported")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    run(qat, tmp_path / "fallback", STEPS["text"], quiet=True, jobs=2)
    assert calls  # the text route does copy tensors as they are
    assert _digests(tmp_path / "native") == _digests(tmp_path / "fallback")


@pytest.mark.parametrize(
    "argv",
    [
        ["repack_q4_0.py", "build", "{qat}", "{out}", "--target", "emb4", "-q"],
        ["repack_q4_0.py", "build", "{qat}", "{out}", "--target", "w8a8", "-q"],
        ["repack_q4_0.py", "check", "{qat}", "-q"],
    ],
    ids=["emb4", "w8a8", "check"],
)
def test_converters_never_import_torch(qat, tmp_path, argv):
    # torch's import was 1-3 s of every run and up to 0.9 GiB of resident memory (CUDA builds).
    assert _imported(argv, {"qat": qat, "out": tmp_path / "out"}, "torch") == []


def test_text_only_never_imports_numba(qat, tmp_path):
    # numba's import (about 0.2 s) is paid only by the steps that recover grids.
    assert (
        _imported(["text_only.py", "{qat}", "{out}", "-q"], {"qat": qat, "out": tmp_path / "out"}, "numba")
        == []
    )


def _imported(argv: list[str], fill: dict, package: str) -> list[str]:
    """The modules of ``package`` loaded by a run of repack/ARGV[0] with ``argv`` in a fresh interpreter."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    args = [a.format(**fill) for a in argv]
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = {args!r}\n"
        "try:\n"
        f"    runpy.run_path({str(root / 'repack' / argv[0])!r}, run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m == {package!r} or m.startswith({package + '.'!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])
