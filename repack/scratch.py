"""Per-thread reusable buffers for the converters' row chunks.

A fresh buffer per chunk costs a page fault per 4 KiB page (and, for numpy's large arrays,
sometimes a huge-page compaction stall), which on a small VM can cost as much as converting
the chunk. Each worker thread keeps its buffers and reuses them chunk
after chunk (which also keeps them in the CPU's cache from one chunk to the next).

Contract: an array from ``array`` is valid until the same thread asks for the same ``key`` again,
so a chunk's results must be consumed (written, or reduced to numbers) before that thread takes
its next chunk. The pipeline's workers and ``check`` do exactly that; other callers leave
``reuse`` off and get fresh arrays.
"""

from __future__ import annotations

import threading

import numpy as np

_local = threading.local()


def array(key: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A C-contiguous array of ``shape`` and ``dtype`` over this thread's buffer ``key`` (contents undefined)."""
    dt = np.dtype(dtype)
    n = dt.itemsize
    for d in shape:
        n *= d
    pool: dict[str, np.ndarray] = _local.__dict__.setdefault("pool", {})
    buf = pool.get(key)
    if buf is None or buf.nbytes < n:
        buf = pool[key] = np.empty(max(n, 1), np.uint8)
    return buf[:n].view(dt).reshape(shape)


def fresh_or_reused(reuse: bool, key: str, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """``array(key, ...)`` when ``reuse``, else a new ``np.empty``."""
    return array(key, shape, dtype) if reuse else np.empty(shape, dtype)
