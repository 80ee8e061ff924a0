"""Per-thread scratch buffers: reused within a thread, never shared between threads."""

from __future__ import annotations

import threading

import numpy as np
import torch

from repack import grid, scratch


def test_same_thread_same_key_reuses_the_memory():
    a = scratch.array("t-reuse", (4, 8), np.int8)
    b = scratch.array("t-reuse", (2, 8), np.int8)  # smaller: a view of the same buffer
    assert np.shares_memory(a, b)
    c = scratch.array("t-reuse", (64, 64), np.float32)  # larger: a new buffer
    assert c.shape == (64, 64) and c.dtype == np.float32 and c.flags.c_contiguous
    assert not np.shares_memory(
        scratch.array("t-other", (4, 8), np.int8), scratch.array("t-reuse", (4, 8), np.int8)
    )


def test_threads_never_share_a_buffer():
    got: list[np.ndarray] = []

    def take() -> None:
        got.append(scratch.array("t-thread", (1024,), np.uint8))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not any(np.shares_memory(a, b) for i, a in enumerate(got) for b in got[i + 1 :])


def test_recover_without_reuse_returns_independent_results():
    gen = torch.Generator().manual_seed(1)
    a = grid.random_on_grid((16, 64), gen)
    b = grid.random_on_grid((16, 64), gen)
    ra, rb = grid.recover(a), grid.recover(b)
    assert not np.shares_memory(ra.levels.numpy(), rb.levels.numpy())
    # With reuse, the second chunk's results overwrite the first's: the documented contract.
    ra, rb = grid.recover(a, reuse=True), grid.recover(b, reuse=True)
    assert np.shares_memory(ra.levels.numpy(), rb.levels.numpy())
    assert torch.equal(rb.levels, grid.recover(b).levels)
