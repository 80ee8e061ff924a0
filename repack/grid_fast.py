"""Q4_0 grid recovery compiled with numba: the fast twin of grid.recover.

``grid.recover_reference`` (torch, whole-block elementwise passes) defines the result; this
kernel computes the same float32 operations per value, so levels, steps, off-grid counts and
errors are bit-identical (tests/unit/test_repack_grid_fast.py checks it).

Layout: groups are taken 16 at a time and transposed into small scratch arrays, value j of
group k at [j * 16 + k], so every loop runs across 16 groups at once and LLVM makes it SIMD code
with no per-group horizontal reductions. The scratch arrays are flat on purpose: numba's 2-D
indexing kept LLVM from vectorizing these loops (measured 20x slower on the same loop).

Per block of 16 groups: widen bf16 to float32 and take each group's peak as an integer max of
the magnitude bits (the same order as the floats' for finite values); try m = 8, 7, 6, 5, 4 on
every lane, each lane keeping the first that fits, as the reference does; take the levels, and
where no level is +-1 divide by their gcd (a table lookup on the set of |levels|); then the
error and pack_int4's words. Groups that fit no step (off-grid input only) take the scalar path
the reference spells out. The least-squares refinement runs only when some solved group is
inexact, as in the reference; for bf16 input its sums are exact in float32, so their order does
not matter.

The kernel is serial and releases the GIL: callers run one per thread on separate row chunks
(the pipeline's workers), which also spreads the reads and writes over the cores.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from repack import scratch

GROUP = 32
_B = 64  # groups per block: one SIMD lane each
_REL = np.float32(2.0**-7)  # grid.REL_TOL
_STOL = np.float32(2.0**-6)  # grid.STEP_TOL
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_NONFINITE = np.uint32(0x7F800000)  # float32 magnitude bits at and above this: inf or NaN
_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}


@numba.njit(inline="always", **_JIT)
def _unsolved(x, g, levels, steps, amax, gcds):  # pragma: no cover - compiled
    """A group no step fits (off-grid input): the reference's amax/8 levels and gcd, scalar.

    x: the group's 32 values; levels: flat [n * 32].
    """
    base = g * GROUP
    step = amax / np.float32(8.0)
    safe = step if step > 0 else _ONE
    ones = 0
    for j in range(GROUP):
        q = np.rint(x[j] / safe)
        levels[base + j] = np.int8(q)
        ones += abs(q) == 1
    if ones == 0:
        mask = 0
        big = 0
        for j in range(GROUP):
            a = abs(np.int32(levels[base + j]))
            big += a > 8
            mask |= np.int32(1) << min(a, 8)
        d = np.int32(gcds[mask])
        if big:  # levels above 8 (subnormal steps): Euclid
            d = np.int32(0)
            for j in range(GROUP):
                a = abs(np.int32(levels[base + j]))
                while a:
                    d, a = a, d % a
        if d > 1:
            df = np.float32(d)
            for j in range(GROUP):
                levels[base + j] = np.int8(np.rint(np.float32(levels[base + j]) / df))
            step = step * df
    steps[g] = step


@numba.njit(inline="always", **_JIT)
def _load(bits, g0, nb, rows, xu, x, tolx, mb):  # pragma: no cover - compiled
    """Groups g0..g0+nb transposed into xu/x ([j * 16 + k]: value j of group g0 + k), idle lanes
    zero; tolx = |x| * REL_TOL (the per-value part of the tolerance); mb[k]: the peak's bits.

    The block is widened row by row into ``rows`` (contiguous reads), then transposed in L1.
    """
    for i in range(nb * GROUP):
        rows[i] = np.uint32(bits[g0 * GROUP + i]) << 16
    for i in range(nb * GROUP, _B * GROUP):
        rows[i] = 0
    for k in range(_B):
        mb[k] = 0
    for j in range(GROUP):
        for k in range(_B):
            u = rows[k * GROUP + j]
            xu[j * _B + k] = u
            a = u & np.uint32(0x7FFFFFFF)
            mb[k] = a if a > mb[k] else mb[k]
    for i in range(GROUP * _B):
        tolx[i] = abs(x[i]) * _REL


@numba.njit(inline="always", **_JIT)
def _lanes(s, safe, steptol):  # pragma: no cover - compiled
    """Per-lane constants of the steps s: the divisor (1 for a zero step) and the step tolerance."""
    for k in range(_B):
        step = s[k]
        safe[k] = step if step > 0 else _ONE
        steptol[k] = step * _STOL


@numba.njit(inline="always", **_JIT)
def _misses(x, tolx, s, safe, steptol, bad):  # pragma: no cover - compiled
    """bad[k]: whether step s[k] misses a value of group k (grid._fits negated)."""
    for k in range(_B):
        bad[k] = 0
    for j in range(GROUP):
        for k in range(_B):
            i = j * _B + k
            step = s[k]
            v = x[i]
            lv = np.rint(v / safe[k])
            tol = max(tolx[i], steptol[k])
            bad[k] |= (abs(lv * step - v) > tol) | (lv < -8) | (lv > 7)


@numba.njit(inline="always", **_JIT)
def _errors(x, lv, step, e, nz):  # pragma: no cover - compiled
    """e[k], nz[k]: max |level * step - x| and the count of inexact values of group k."""
    for k in range(_B):
        e[k] = _ZERO
        nz[k] = 0
    for j in range(GROUP):
        for k in range(_B):
            i = j * _B + k
            d = abs(lv[i] * step[k] - x[i])
            e[k] = d if d > e[k] else e[k]
            nz[k] += d != 0


@numba.njit(**_JIT)
def _recover(bits, levels, packed, steps, solved, maxerr, gcds):  # pragma: no cover - compiled
    """bits: bf16 as uint16, flat [n * 32]; levels flat [n * 32]; packed flat [n * 4].

    Fills the outputs; False if a value is not finite.
    """
    n = bits.shape[0] // GROUP
    rows = np.empty(_B * GROUP, np.uint32)
    x = np.empty(GROUP * _B, np.float32)
    xu = x.view(np.uint32)
    tolx = np.empty(GROUP * _B, np.float32)
    lv = np.empty(GROUP * _B, np.float32)
    lvi = np.empty(GROUP * _B, np.int8)
    words = np.empty(GROUP // 8 * _B, np.uint32)
    mb = np.empty(_B, np.uint32)
    amax = np.empty(_B, np.float32)
    amaxu = amax.view(np.uint32)
    s = np.empty(_B, np.float32)
    safe = np.empty(_B, np.float32)
    steptol = np.empty(_B, np.float32)
    step = np.empty(_B, np.float32)
    inv = np.empty(_B, np.float32)
    bad = np.empty(_B, np.int32)
    ok = np.empty(_B, np.int32)
    ones = np.empty(_B, np.int32)
    mask = np.empty(_B, np.int32)
    e = np.empty(_B, np.float32)
    nz = np.empty(_B, np.int32)
    row = np.empty(GROUP, np.float32)
    rowu = row.view(np.uint32)
    inexact = False
    for g0 in range(0, n, _B):
        nb = min(_B, n - g0)
        _load(bits, g0, nb, rows, xu, x, tolx, mb)
        for k in range(_B):  # idle lanes hold zeros: a solved all-zero group, never stored
            if mb[k] >= _NONFINITE:
                return False
            amaxu[k] = mb[k]
            step[k] = amax[k] / np.float32(8.0)  # unsolved groups keep the amax/8 levels
            ok[k] = 0
        for m in (8, 7, 6, 5, 4):  # the first step that fits wins, as in the reference
            for k in range(_B):
                s[k] = amax[k] / np.float32(m)
            _lanes(s, safe, steptol)
            _misses(x, tolx, s, safe, steptol, bad)
            left = 0
            for k in range(_B):
                take = (ok[k] == 0) & (bad[k] == 0)
                step[k] = s[k] if take else step[k]
                ok[k] |= take
                left += ok[k] == 0
            if left == 0:
                break
        _lanes(step, safe, steptol)
        for k in range(_B):
            ones[k] = 0
            mask[k] = 0
        for j in range(GROUP):
            for k in range(_B):
                i = j * _B + k
                v = np.rint(x[i] / safe[k])
                lv[i] = v
                a = abs(v)
                ones[k] += a == 1
                mask[k] |= np.int32(1) << np.int32(min(a, np.float32(8.0)))
        for k in range(_B):  # the coarsest grid: divide by the levels' gcd when no level is +-1
            d = np.int32(gcds[mask[k]]) if ones[k] == 0 and ok[k] else np.int32(1)
            inv[k] = _ONE / np.float32(max(d, 1))
            step[k] = step[k] * np.float32(max(d, 1))
            e[k] = _ZERO
            nz[k] = 0
        for i in range(GROUP // 8 * _B):
            words[i] = 0
        for j in range(GROUP):  # final levels, their error and pack_int4's words in one pass
            sh = np.uint32(4 * (j % 8))  # nibble j % 8 of word j // 8 holds level j, +8
            wb = (j // 8) * _B
            for k in range(_B):
                i = j * _B + k
                lf = np.rint(lv[i] * inv[k])  # exact: the gcd divides every level
                d = abs(lf * step[k] - x[i])
                e[k] = d if d > e[k] else e[k]
                nz[k] += d != 0
                li = np.int32(lf)
                lvi[i] = np.int8(li)
                words[wb + k] |= np.uint32(li + 8) << sh
        for k in range(nb):
            g = g0 + k
            if ok[k]:
                for j in range(GROUP):
                    levels[g * GROUP + j] = lvi[j * _B + k]
                for w in range(GROUP // 8):
                    packed[g * (GROUP // 8) + w] = words[w * _B + k]
                steps[g] = step[k]
                solved[g] = True
                maxerr[g] = e[k]
                inexact |= nz[k] != 0
            else:
                for j in range(GROUP):
                    rowu[j] = np.uint32(bits[g * GROUP + j]) << 16
                _unsolved(row, g, levels, steps, amax[k], gcds)
                for w in range(GROUP // 8):
                    word = np.uint32(0)
                    for i in range(8):
                        word |= np.uint32(levels[g * GROUP + 8 * w + i] + 8) << np.uint32(4 * i)
                    packed[g * (GROUP // 8) + w] = word
                solved[g] = False
                maxerr[g] = _ZERO
    if inexact:
        _refine(bits, levels, steps, solved, maxerr, rows, xu, x, tolx, lv, mb, s, safe, steptol, bad, e, nz)
    return True


@numba.njit(inline="always", **_JIT)
def _refine(
    bits, levels, steps, solved, maxerr, rows, xu, x, tolx, lv, mb, ref, safe, steptol, bad, e, nz
):  # pragma: no cover - compiled
    """Least squares on every solved group (the reference's all-or-nothing trigger): keep the
    refined step where it still fits and gives the same levels."""
    n = bits.shape[0] // GROUP
    den = np.empty(_B, np.float32)
    num = np.empty(_B, np.float32)
    for g0 in range(0, n, _B):
        nb = min(_B, n - g0)
        _load(bits, g0, nb, rows, xu, x, tolx, mb)
        for k in range(_B):
            den[k] = _ZERO
            num[k] = _ZERO
        for j in range(GROUP):
            for k in range(_B):
                i = j * _B + k
                lf = np.float32(levels[(g0 + k) * GROUP + j]) if k < nb else _ZERO
                lv[i] = lf
                den[k] += lf * lf
                num[k] += x[i] * lf
        for k in range(_B):
            old = steps[g0 + k] if k < nb else _ZERO
            ref[k] = num[k] / max(den[k], _ONE) if den[k] > 0 else old
        _lanes(ref, safe, steptol)
        _misses(x, tolx, ref, safe, steptol, bad)
        for j in range(GROUP):  # the refined step must give the same levels
            for k in range(_B):
                i = j * _B + k
                bad[k] |= np.rint(x[i] / safe[k]) != lv[i]
        _errors(x, lv, ref, e, nz)
        for k in range(nb):
            g = g0 + k
            if solved[g] and bad[k] == 0:
                steps[g] = ref[k]
                maxerr[g] = e[k]


def _gcd_table() -> np.ndarray:
    """gcd of every subset of 0..8, indexed by its bit mask."""
    t = np.zeros(1 << 9, np.int8)
    for mask in range(1 << 9):
        t[mask] = math.gcd(*[v for v in range(9) if mask >> v & 1], 0)
    return t


_GCDS = _gcd_table()


def recover_bf16(bits: np.ndarray, reuse: bool = False) -> tuple[np.ndarray, ...] | None:
    """bf16 groups as uint16 [n, 32] -> levels int8 [n, 32], packed int32 [n, 4] (pack_int4's
    words), steps f32 [n], solved bool [n], max error f32 [n].

    None when a value is not finite (the caller then uses the reference). With ``reuse`` the
    outputs live in this thread's scratch buffers (repack.scratch).
    """
    n = bits.shape[0]
    levels = scratch.fresh_or_reused(reuse, "levels", (n, GROUP), np.int8)
    packed = scratch.fresh_or_reused(reuse, "packed", (n, GROUP // 8), np.uint32)
    steps = scratch.fresh_or_reused(reuse, "steps", (n,), np.float32)
    solved = scratch.fresh_or_reused(reuse, "solved", (n,), np.bool_)
    maxerr = scratch.fresh_or_reused(reuse, "maxerr", (n,), np.float32)
    flat = np.ascontiguousarray(bits).reshape(-1)
    if n and not _recover(flat, levels.reshape(-1), packed.reshape(-1), steps, solved, maxerr, _GCDS):
        return None
    return levels, packed.view(np.int32), steps, solved, maxerr
