"""Q4_0 grid recovery in one compiled pass over the groups (numba): the fast twin of grid.recover.

``grid.recover_reference`` (torch, whole-block elementwise passes) defines the result; this
kernel computes the same float32 operations in the same order per value, so levels, steps,
off-grid counts and errors are bit-identical (tests/unit/test_repack_grid_fast.py checks it).

Per group of 32 values the work is a few fixed-length loops with no early exit, which LLVM turns
into SIMD code: widen bf16 to float32 while taking the peak as an integer max of the magnitude
bits (the same order as the floats' for finite values), then try m = 8..4 (keeping the first
that fits, as the reference does) with levels stored on the way, reduce by the gcd only when no
level is +-1 (a table lookup on the set of |levels|), measure the error (a max over the float
bits, exact for non-negative floats) and pack. Groups that fit no step (off-grid input only)
take the scalar path the reference spells out. The least-squares refinement runs only when
some solved group is inexact, as in the reference; for bf16 input its sums are exact in
float32, so their order does not matter.

The kernel is serial and releases the GIL: callers run one per thread on separate row chunks
(the pipeline's workers), which also spreads the reads and writes over the cores.
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
_NONFINITE = np.uint32(0x7F80)  # bf16 magnitude bits at and above this: inf or NaN
_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}


@numba.njit(inline="always", **_JIT)
def _unsolved(x, g, levels, steps, amax, gcds):  # pragma: no cover - compiled
    """A group no step fits (off-grid input): the reference's amax/8 levels and gcd, scalar."""
    step = amax / np.float32(8.0)
    safe = step if step > 0 else _ONE
    ones = 0
    for j in range(GROUP):
        q = np.rint(x[j] / safe)
        levels[g, j] = np.int8(q)
        ones += abs(q) == 1
    if ones == 0:
        mask = 0
        big = 0
        for j in range(GROUP):
            a = abs(np.int32(levels[g, j]))
            big += a > 8
            mask |= np.int32(1) << min(a, 8)
        d = np.int32(gcds[mask])
        if big:  # levels above 8 (subnormal steps): Euclid
            d = np.int32(0)
            for j in range(GROUP):
                a = abs(np.int32(levels[g, j]))
                while a:
                    d, a = a, d % a
        if d > 1:
            df = np.float32(d)
            for j in range(GROUP):
                levels[g, j] = np.int8(np.rint(np.float32(levels[g, j]) / df))
            step = step * df
    steps[g] = step


_B = 16  # groups per block: one lane each, so the loops over a block's groups become SIMD code


@numba.njit(inline="always", **_JIT)
def _load(bits, g0, nb, xu, mb):  # pragma: no cover - compiled
    """Block of groups g0..g0+nb, transposed (xu[j, k]: value j of group g0+k as float32 bits);
    mb[k]: the group's largest magnitude bits."""
    for k in range(_B):
        mb[k] = 0
    for j in range(GROUP):
        for k in range(_B):
            u = np.uint32(bits[g0 + k, j]) if k < nb else np.uint32(0)  # idle lanes: zeros
            xu[j, k] = u << 16
            a = u & np.uint32(0x7FFF)
            mb[k] = a if a > mb[k] else mb[k]


@numba.njit(inline="always", **_JIT)
def _misses(x, s, nb, bad, q):  # pragma: no cover - compiled
    """bad[k]: whether step s[k] misses a value of group k (grid._fits negated); q: the levels."""
    for k in range(_B):
        bad[k] = 0
    for j in range(GROUP):
        for k in range(_B):
            step = s[k]
            safe = step if step > 0 else _ONE
            v = x[j, k]
            lv = np.rint(v / safe)
            tol = max(abs(v) * _REL, step * _STOL)
            bad[k] |= (abs(lv * step - v) > tol) | (lv < -8) | (lv > 7)
            q[j, k] = lv


@numba.njit(inline="always", **_JIT)
def _errors(x, lv, step, nb, e, nz):  # pragma: no cover - compiled
    """e[k], nz[k]: max |level*step - x| and the count of inexact values of group k."""
    for k in range(_B):
        e[k] = _ZERO
        nz[k] = 0
    for j in range(GROUP):
        for k in range(_B):
            d = abs(lv[j, k] * step[k] - x[j, k])
            e[k] = d if d > e[k] else e[k]
            nz[k] += d != 0


@numba.njit(**_JIT)
def _recover(bits, levels, packed, steps, solved, maxerr, gcds):  # pragma: no cover - compiled
    """bits: bf16 as uint16 [n, 32]. Fills the outputs; False if a value is not finite."""
    n = bits.shape[0]
    x = np.empty((GROUP, _B), np.float32)
    xu = x.view(np.uint32)
    lv = np.empty((GROUP, _B), np.float32)
    q = np.empty((GROUP, _B), np.float32)
    words = np.empty((GROUP // 8, _B), np.uint32)
    mb = np.empty(_B, np.uint32)
    amax = np.empty(_B, np.float32)
    amaxu = amax.view(np.uint32)
    s = np.empty(_B, np.float32)
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
        _load(bits, g0, nb, xu, mb)
        for k in range(_B):  # idle lanes hold zeros: a solved all-zero group, never stored
            if mb[k] >= _NONFINITE:
                return False
            amaxu[k] = mb[k] << 16
            step[k] = amax[k] / np.float32(8.0)  # unsolved groups keep the amax/8 levels
            ok[k] = 0
        for m in (8, 7, 6, 5, 4):  # the first step that fits wins, as in the reference
            for k in range(_B):
                s[k] = amax[k] / np.float32(m)
            _misses(x, s, nb, bad, q)
            left = 0
            for k in range(_B):
                take = (ok[k] == 0) & (bad[k] == 0)
                step[k] = s[k] if take else step[k]
                ok[k] |= take
                left += ok[k] == 0
            if left == 0:
                break
        for k in range(_B):
            ones[k] = 0
            mask[k] = 0
        for j in range(GROUP):
            for k in range(_B):
                st = step[k]
                v = np.rint(x[j, k] / (st if st > 0 else _ONE))
                lv[j, k] = v
                a = abs(v)
                ones[k] += a == 1
                mask[k] |= np.int32(1) << np.int32(min(a, np.float32(8.0)))
        for k in range(_B):  # the coarsest grid: divide by the levels' gcd when no level is +-1
            d = np.int32(gcds[mask[k]]) if ones[k] == 0 and ok[k] else np.int32(1)
            inv[k] = _ONE / np.float32(max(d, 1))
            step[k] = step[k] * np.float32(max(d, 1))
        for j in range(GROUP):
            for k in range(_B):
                lv[j, k] = np.rint(lv[j, k] * inv[k])  # exact: the gcd divides every level
        _errors(x, lv, step, nb, e, nz)
        for w in range(GROUP // 8):  # pack_int4's words: nibble i of word w = level 8w+i, +8
            for k in range(_B):
                words[w, k] = 0
            for i in range(8):
                for k in range(_B):
                    words[w, k] |= np.uint32(np.int32(lv[8 * w + i, k]) + 8) << np.uint32(4 * i)
        for k in range(nb):
            g = g0 + k
            if ok[k]:
                for j in range(GROUP):
                    levels[g, j] = np.int8(lv[j, k])
                for w in range(GROUP // 8):
                    packed[g, w] = words[w, k]
                steps[g] = step[k]
                solved[g] = True
                maxerr[g] = e[k]
                inexact |= nz[k] != 0
            else:
                for j in range(GROUP):
                    rowu[j] = np.uint32(bits[g, j]) << 16
                _unsolved(row, g, levels, steps, amax[k], gcds)
                for w in range(GROUP // 8):
                    word = np.uint32(0)
                    for i in range(8):
                        word |= np.uint32(levels[g, 8 * w + i] + 8) << np.uint32(4 * i)
                    packed[g, w] = word
                solved[g] = False
                maxerr[g] = _ZERO
    if inexact:
        _refine(bits, levels, steps, solved, maxerr, x, xu, lv, q, mb, s, step, bad, e, nz)
    return True


@numba.njit(inline="always", **_JIT)
def _refine(bits, levels, steps, solved, maxerr, x, xu, lv, q, mb, ref, step, bad, e, nz):  # pragma: no cover
    """Least squares on every solved group (the reference's all-or-nothing trigger): keep the
    refined step where it still fits and gives the same levels."""
    n = bits.shape[0]
    den = np.empty(_B, np.float32)
    num = np.empty(_B, np.float32)
    for g0 in range(0, n, _B):
        nb = min(_B, n - g0)
        _load(bits, g0, nb, xu, mb)
        for k in range(_B):
            step[k] = steps[g0 + k] if k < nb else _ZERO
            den[k] = _ZERO
            num[k] = _ZERO
        for j in range(GROUP):
            for k in range(_B):
                lf = np.float32(levels[g0 + k, j]) if k < nb else _ZERO
                lv[j, k] = lf
                den[k] += lf * lf
                num[k] += x[j, k] * lf
        for k in range(_B):
            ref[k] = num[k] / max(den[k], _ONE) if den[k] > 0 else step[k]
        _misses(x, ref, nb, bad, q)
        for j in range(GROUP):
            for k in range(_B):
                bad[k] |= q[j, k] != lv[j, k]
        _errors(x, lv, ref, nb, e, nz)
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
