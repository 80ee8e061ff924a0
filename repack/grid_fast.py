"""Q4_0 grid recovery in one compiled pass over the groups (numba): the fast twin of grid.recover.

``grid.recover_reference`` (torch, whole-block elementwise passes) defines the result; this
kernel computes the same float32 operations in the same order per value, so levels, steps,
off-grid counts and errors are bit-identical (tests/unit/test_repack_grid_fast.py checks it).
Where torch does a dozen passes over a float32 copy of the block, the kernel converts 32 bf16
values at a time into a small per-thread buffer and, per group: finds amax, tries m = 8..4
(stopping at the first that fits, as the reference keeps the first), stores the levels while
measuring their error, and reduces by the gcd only for groups with no level of +-1 (a +-1 level
means the gcd is 1). The least-squares refinement runs only when some solved group is inexact,
as in the reference. Only bf16 input takes this path: for it the refinement's sum is exact in
float32 (so its order does not matter), which the reference's vectorized sum relies on too.
"""

from __future__ import annotations

import math

import numba
import numpy as np

GROUP = 32
_REL = np.float32(2.0**-7)  # grid.REL_TOL
_STOL = np.float32(2.0**-6)  # grid.STEP_TOL
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_CHUNK = 1024  # groups per scratch buffer (128 KiB of float32: stays in L2)


@numba.njit(inline="always", error_model="numpy")
def _load_chunk(bits, g0, g1):  # pragma: no cover - compiled
    """Groups g0..g1 of raw bf16 bits as float32 (bf16 is the top half of a float32)."""
    x = np.empty((_CHUNK, GROUP), np.float32)
    xu = x.view(np.uint32)
    for b in range(g1 - g0):
        for j in range(GROUP):
            xu[b, j] = np.uint32(bits[g0 + b, j]) << 16
    return x


@numba.njit(inline="always", error_model="numpy")
def _misses(x, b, step):  # pragma: no cover - compiled
    """Whether ``step`` misses a value of group ``b`` (row of x): grid._fits, negated.

    The first 8 values decide most misses, so the other 24 are tested only when those fit.
    """
    return _misses_in(x, b, step, 0, 8) or _misses_in(x, b, step, 8, GROUP)


@numba.njit(inline="always", error_model="numpy")
def _misses_in(x, b, step, lo, hi):  # pragma: no cover - compiled
    """Values lo..hi-1 of group ``b`` that ``step`` does not reproduce."""
    safe = step if step > 0 else _ONE
    st = step * _STOL
    bad = 0
    for j in range(lo, hi):
        v = x[b, j]
        lv = np.rint(v / safe)
        tol = max(abs(v) * _REL, st)
        bad += (abs(lv * step - v) > tol) | (lv < -8) | (lv > 7)
    return bad


@numba.njit(inline="always", error_model="numpy")
def _errors(x, b, levels, g, step):  # pragma: no cover - compiled
    """(max |level*step - x|, count of inexact values) of one group."""
    e = _ZERO
    nz = 0
    for j in range(GROUP):
        d = abs(np.float32(levels[g, j]) * step - x[b, j])
        e = d if d > e else e
        nz += d != 0
    return e, nz


@numba.njit(inline="always", error_model="numpy")
def _gcd(levels, g, gcds):  # pragma: no cover - compiled
    """gcd of a group's levels (0 when all are zero): a table lookup on the set of |levels| 0..8."""
    mask = 0
    big = 0
    for j in range(GROUP):
        a = np.int32(levels[g, j])
        a = a if a >= 0 else -a
        big += a > 8
        mask |= np.int32(1) << min(a, 8)
    if big == 0:
        return np.int32(gcds[mask])
    d = np.int32(0)  # levels above 8 (only in off-grid groups with subnormal steps): Euclid
    for j in range(GROUP):
        a = np.int32(levels[g, j])
        a = a if a >= 0 else -a
        while a:
            d, a = a, d % a
    return d


def _gcd_table() -> np.ndarray:
    """gcd of every subset of 0..8, indexed by its bit mask."""
    t = np.zeros(1 << 9, np.int8)
    for mask in range(1 << 9):
        t[mask] = math.gcd(*[v for v in range(9) if mask >> v & 1], 0)
    return t


_GCDS = _gcd_table()


@numba.njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _recover(bits, levels, packed, steps, solved, maxerr, gcds):  # pragma: no cover - compiled
    """bits: bf16 as uint16 [n, 32]. Fills levels/steps/solved/maxerr; False if a value is not finite."""
    n = bits.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    inexact = np.zeros(nchunks, np.uint8)
    bad = np.zeros(nchunks, np.uint8)
    for c in numba.prange(nchunks):
        g0 = c * _CHUNK
        g1 = min(n, g0 + _CHUNK)
        x = _load_chunk(bits, g0, g1)
        for b in range(g1 - g0):
            g = g0 + b
            amax = _ZERO
            for j in range(GROUP):
                a = abs(x[b, j])
                amax = a if a > amax else amax
            if not np.isfinite(amax) or amax != amax:
                bad[c] = 1
                continue
            step = amax / np.float32(8.0)
            ok = not _misses(x, b, step)
            if not ok:
                for m in (7, 6, 5, 4):
                    s = amax / np.float32(m)
                    if not _misses(x, b, s):
                        step = s
                        ok = True
                        break
            # Unsolved groups keep the amax/8 levels, as in the reference.
            safe = step if step > 0 else _ONE
            ones = 0
            e = _ZERO
            nz = 0
            for j in range(GROUP):
                v = x[b, j]
                lv = np.rint(v / safe)
                levels[g, j] = np.int8(lv)
                ones += abs(lv) == 1
                d = abs(lv * step - v)
                e = d if d > e else e
                nz += d != 0
            if ones == 0:
                d = _gcd(levels, g, gcds)
                if d > 1:
                    df = np.float32(d)
                    for j in range(GROUP):  # exact: d divides every level
                        levels[g, j] = np.int8(np.rint(np.float32(levels[g, j]) / df))
                    step = step * df
                    e, nz = _errors(x, b, levels, g, step)
            for w in range(GROUP // 8):  # pack_int4's words: nibble i of word w = level 8w+i, +8
                word = np.uint32(0)
                for i in range(8):
                    word |= np.uint32(levels[g, 8 * w + i] + 8) << np.uint32(4 * i)
                packed[g, w] = word
            steps[g] = step
            solved[g] = ok
            maxerr[g] = e if ok else _ZERO
            if ok and nz:
                inexact[c] = 1
    if bad.any():
        return False
    if not inexact.any():
        return True
    # Least squares, on every solved group (the reference's all-or-nothing trigger).
    for c in numba.prange(nchunks):
        g0 = c * _CHUNK
        g1 = min(n, g0 + _CHUNK)
        x = _load_chunk(bits, g0, g1)
        for b in range(g1 - g0):
            g = g0 + b
            if not solved[g]:
                continue
            den = _ZERO
            num = _ZERO
            for j in range(GROUP):
                lf = np.float32(levels[g, j])
                den += lf * lf
                num += x[b, j] * lf
            ref = num / max(den, _ONE) if den > 0 else steps[g]
            if _misses(x, b, ref):
                continue
            safe = ref if ref > 0 else _ONE
            diff = 0
            for j in range(GROUP):
                diff += np.rint(x[b, j] / safe) != np.float32(levels[g, j])
            if diff == 0:
                steps[g] = ref
                maxerr[g] = _errors(x, b, levels, g, ref)[0]
    return True


def recover_bf16(bits: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """bf16 groups as uint16 [n, 32] -> levels int8 [n, 32], packed int32 [n, 4] (pack_int4's
    words), steps f32 [n], solved bool [n], max error f32 [n].

    None when a value is not finite (the caller then uses the reference).
    """
    n = bits.shape[0]
    levels = np.empty((n, GROUP), np.int8)
    packed = np.empty((n, GROUP // 8), np.uint32)
    steps = np.empty(n, np.float32)
    solved = np.empty(n, np.bool_)
    maxerr = np.empty(n, np.float32)
    if n and not _recover(np.ascontiguousarray(bits), levels, packed, steps, solved, maxerr, _GCDS):
        return None
    return levels, packed.view(np.int32), steps, solved, maxerr
