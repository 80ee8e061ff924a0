"""Q4_0 grid recovery compiled with numba: the fast twin of grid.recover.

``grid.recover_reference`` (torch, whole-block elementwise passes) defines the result; this
kernel computes the same float32 operations per value, so levels, steps, off-grid counts and
errors are bit-identical (tests/unit/test_repack_grid_fast.py checks it).

Layout: groups are taken 64 at a time, transposed so that value j of group k sits at
[j * 64 + k]; every loop then runs across 64 groups at once and LLVM makes it SIMD code with no
per-group horizontal reductions. numpy transposes the input, and the levels back when they are
asked for (its strided copy is faster than the same loop here); the packed words, four
per group, the kernel puts back in row order itself while they are in cache (a third of numpy's
time). The scratch arrays are flat on purpose: numba's 2-D indexing, and
inner loops of 16 or 32, kept LLVM from vectorizing (an order of magnitude slower on the same loop).
Passes that reduce over a group's values walk them eight at a time inside the loop over groups
(four for the screen): LLVM unrolls those eight and keeps each group's running values (peak,
miss flags, error, sums, packed word) in registers, where a loop over values outside the loop
over groups loaded and stored them once per value (the final pass ran about three times
slower that way). Sixteen or more at a time is not
vectorized at all.

Per block of 64 groups: widen bf16 to float32 and take each group's peak as an integer max of
the magnitude bits (the same order as the floats' for finite values); screen the five candidate
steps m = 8, 7, 6, 5, 4 in one cheap pass (a necessary condition, looser than the exact test),
then run the reference's exact test on each lane's first unscreened candidate, moving on only
where it fails, so each lane keeps the first step that fits, as the reference does, usually
after one exact pass instead of up to five. That pass also keeps the levels and collects the
set of their magnitudes, so their gcd is a table lookup. One more pass
divides by it and produces the error, the least-squares sums and pack_int4's words; groups
left inexact (values rounded to bf16) get the refinement, as in the reference, in the same
block. For bf16 input the sums are exact in float32, so their order does not matter. Groups
that fit no step (off-grid input only) take the scalar path the reference spells out.

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
_BLOCK = GROUP * _B  # values per block
_SCREENED = 12  # values of each group the candidate screen looks at (8: +4%, 32: +12% time)
_QUADS = GROUP // 4  # uint64 words per group of bf16 input
_SUB = 1 << 16  # groups per sub-chunk (4 MiB of bf16): bounds the transposed input copy
_REL = np.float32(2.0**-7)  # grid.REL_TOL
_SCREEN = np.float32(0.07)  # the screen's slack: above the exact test's 1/16 plus rounding
_STOL = np.float32(2.0**-6)  # grid.STEP_TOL
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_NONFINITE = np.uint32(0x7F800000)  # float32 magnitude bits at and above this: inf or NaN
_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}


@numba.njit(inline="always", **_JIT)
def _unsolved(x, lev, amax, gcds):  # pragma: no cover - compiled
    """A group no step fits (off-grid input): the reference's amax/8 levels (into ``lev``) and
    gcd, scalar; returns the step. x: the group's 32 values."""
    step = amax / np.float32(8.0)
    safe = step if step > 0 else _ONE
    ones = 0
    for j in range(GROUP):
        q = np.rint(x[j] / safe)
        lev[j] = np.int8(q)
        ones += abs(q) == 1
    if ones == 0:
        mask = 0
        big = 0
        for j in range(GROUP):
            a = abs(np.int32(lev[j]))
            big += a > 8
            mask |= np.int32(1) << min(a, 8)
        d = np.int32(gcds[mask])
        if big:  # levels above 8 (subnormal steps): Euclid
            d = np.int32(0)
            for j in range(GROUP):
                a = abs(np.int32(lev[j]))
                while a:
                    d, a = a, d % a
        if d > 1:
            df = np.float32(d)
            for j in range(GROUP):
                lev[j] = np.int8(np.rint(np.float32(lev[j]) / df))
            step = step * df
    return step


@numba.njit(inline="always", **_JIT)
def _load(tquads, b, xu, mb, top):  # pragma: no cover - compiled
    """Block ``b`` of the transposed input (see _transpose_in) into xu (float32 bits, value j of
    group k at [j * 64 + k]); mb[k] = the bits of group k's peak magnitude; top[k] = the int32
    bits of its largest value (the peak's bits exactly when the peak is positive)."""
    for k in range(_B):
        mb[k] = 0
        top[k] = np.int32(-(2**31))
    for h in range(_QUADS // 2):  # two words (8 values) per lane at a time: see the module's notes
        for k in range(_B):
            m = mb[k]
            t = top[k]
            for q in range(2 * h, 2 * h + 2):
                w = tquads[(b * _QUADS + q) * _B + k]
                for r in range(4):  # little-endian: value 4q + r is bits 16r..16r+15
                    u = np.uint32((w >> np.uint64(16 * r)) & np.uint64(0xFFFF)) << 16
                    xu[(4 * q + r) * _B + k] = u
                    a = u & np.uint32(0x7FFFFFFF)
                    m = a if a > m else m
                    v = np.int32(u)  # negative floats are negative int32s; positive ones keep their order
                    t = v if v > t else t
            mb[k] = m
            top[k] = t


@numba.njit(inline="always", **_JIT)
def _lanes(s, safe, steptol):  # pragma: no cover - compiled
    """Per-lane constants of the steps s: the divisor (1 for a zero step) and the step tolerance."""
    for k in range(_B):
        step = s[k]
        safe[k] = step if step > 0 else _ONE
        steptol[k] = step * _STOL


@numba.njit(inline="always", **_JIT)
def _misses(x, s, safe, steptol, lv, bad, mask):  # pragma: no cover - compiled
    """For step s[k] on group k: bad[k], whether it misses a value (grid._fits negated); the
    levels into lv; mask[k], the set of their magnitudes (bit 8 for any above 7)."""
    for k in range(_B):
        bad[k] = 0
        mask[k] = 0
    for h in range(GROUP // 8):
        for k in range(_B):
            step = s[k]
            div = safe[k]
            stol = steptol[k]
            bk = bad[k]
            mk = mask[k]
            for t in range(8):
                i = (8 * h + t) * _B + k
                v = x[i]
                q = np.rint(v / div)
                lv[i] = q
                tol = max(abs(v) * _REL, stol)  # the reference's tol_x, then its maximum
                bk |= (abs(q * step - v) > tol) | (q < -8) | (q > 7)
                mk |= np.int32(1) << np.int32(min(abs(q), np.float32(8.0)))
            bad[k] = bk
            mask[k] = mk


@numba.njit(inline="always", **_JIT)
def _screen(x, amax, positive, rinv, rejected):  # pragma: no cover - compiled
    """rejected[k]: bit c set when m = 8 - c cannot fit group k, for the five candidates at once.

    A cheap necessary condition, one pass for all five over the first _SCREENED values of each
    group: m * x / amax must lie within _SCREEN of an integer, and below 8 for m = 8; and m = 8
    is out when the peak is positive (``positive[k]``: its level would be +8). The exact test
    accepts only values within 1/16 of a level (plus float rounding, about 1e-6 here), so every
    step it accepts passes this screen: trying the unrejected candidates in order still finds
    the reference's first fit, usually with one exact pass instead of five. Twelve values are
    enough to reject a wrong candidate almost always (on random levels a wrong m passes a value
    with odds of 1/2 or less) at well under half the cost of all 32. m = 4 reuses m = 8's product: a
    fit at m = 4 puts 8 x / amax within 2/16 of an (even) integer, so twice the slack there is
    still a necessary condition. NaN (a subnormal peak overflowing 1/amax) rejects nothing.
    """
    for k in range(_B):
        a = amax[k]
        rinv[k] = _ONE / a if a > 0 else _ZERO
        rejected[k] = np.int32(positive[k])
    for h in range(_SCREENED // 4):
        for k in range(_B):
            ri = rinv[k]
            acc = rejected[k]
            for t in range(4):
                r = x[(4 * h + t) * _B + k] * ri
                t8 = r * np.float32(8.0)
                t7 = r * np.float32(7.0)
                t6 = r * np.float32(6.0)
                t5 = r * np.float32(5.0)
                q8 = np.rint(t8)
                d8 = abs(q8 - t8)
                acc |= (
                    np.int32((d8 > _SCREEN) | (q8 > 7))
                    | (np.int32(abs(np.rint(t7) - t7) > _SCREEN) << 1)
                    | (np.int32(abs(np.rint(t6) - t6) > _SCREEN) << 2)
                    | (np.int32(abs(np.rint(t5) - t5) > _SCREEN) << 3)
                    | (np.int32(d8 > 2 * _SCREEN) << 4)
                )
            rejected[k] = acc


@numba.njit(inline="always", **_JIT)
def _first_open(tried):  # pragma: no cover - compiled
    """The first candidate (0..4) whose bit is not set in ``tried``; 5 when all five are."""
    low = ~tried & (tried + 1)  # the lowest clear bit, alone
    return np.int32(low > 1) + np.int32(low > 2) + np.int32(low > 4) + np.int32(low > 8) + np.int32(low > 16)


@numba.njit(inline="always", **_JIT)
def _block_arrays():  # pragma: no cover - compiled
    """Scratch for one block: x and its bits, the levels (float32), the peaks' bits, the top
    values' bits."""
    x = np.empty(_BLOCK, np.float32)
    return x, x.view(np.uint32), np.zeros(_BLOCK, np.float32), np.empty(_B, np.uint32), np.empty(_B, np.int32)


@numba.njit(**_JIT)
def _recover(tquads, nb, want_levels, tlev, packed, steps, solved, maxerr, gcds):  # pragma: no cover
    """Blocks of transposed bf16 bits -> transposed levels, packed words, per-group results.

    tquads: uint64 [blocks * 512] (_transpose_in's layout); nb: real groups (the rest are
    zero padding); tlev: int8 [blocks * 2048] ([j * 64 + k]), written only if ``want_levels``;
    packed: uint32 [nb * 4], pack_int4's words in row order (group g's word w at [4 g + w]:
    each block's words are put back in row order here, while they are in cache, which costs
    a third of numpy's strided copy afterwards). Returns -1 if a value is not finite, else 0.
    """
    x, xu, lv, mb, top = _block_arrays()
    positive = np.empty(_B, np.int32)
    amax = np.empty(_B, np.float32)
    amaxu = amax.view(np.uint32)
    s = np.empty(_B, np.float32)
    safe = np.empty(_B, np.float32)
    steptol = np.empty(_B, np.float32)
    step = np.empty(_B, np.float32)
    inv = np.empty(_B, np.float32)
    bad = np.empty(_B, np.int32)
    ok = np.empty(_B, np.int32)
    mask = np.empty(_B, np.int32)
    e = np.empty(_B, np.float32)
    nz = np.empty(_B, np.int32)
    num = np.empty(_B, np.float32)
    den = np.empty(_B, np.float32)
    e2 = np.empty(_B, np.float32)
    row = np.empty(GROUP, np.float32)
    tpack = np.empty(GROUP // 8 * _B, np.uint32)  # this block's words, [w * 64 + k]
    lev = np.empty(GROUP, np.int8)
    rinv = np.empty(_B, np.float32)
    tried = np.empty(_B, np.int32)
    cand = np.empty(_B, np.int32)
    for b in range(tquads.shape[0] // (_QUADS * _B)):
        g0 = b * _B
        _load(tquads, b, xu, mb, top)
        nonfinite = 0
        for k in range(_B):  # padding lanes hold zeros: a solved all-zero group, never kept
            nonfinite |= mb[k] >= _NONFINITE
            amaxu[k] = mb[k]
            positive[k] = (np.int32(mb[k]) == top[k]) & (mb[k] > 0)
            step[k] = amax[k] / np.float32(8.0)  # unsolved groups keep the amax/8 levels
            ok[k] = 0
        if nonfinite:
            return -1
        _screen(x, amax, positive, rinv, tried)  # candidates the screen rejects count as tried
        # Each lane tries its first untried candidate: the first that fits wins. Lanes already
        # solved test their winning step again, so lv ends holding every solved lane's levels.
        while True:
            left = 0
            for k in range(_B):
                c = _first_open(tried[k] | (31 * ok[k]))
                cand[k] = c
                left += c < 5
                s[k] = step[k] if ok[k] else amax[k] / np.float32(8 - min(c, 4))
            if left == 0:
                break
            _lanes(s, safe, steptol)
            _misses(x, s, safe, steptol, lv, bad, mask)
            for k in range(_B):
                c = cand[k]
                take = (c < 5) & (bad[k] == 0)
                step[k] = s[k] if take else step[k]
                ok[k] |= take
                tried[k] |= (1 << c) & 31
        for k in range(_B):  # the coarsest grid: divide by the levels' gcd (1 if any is +-1)
            d = np.int32(gcds[mask[k] & 511]) if ok[k] else np.int32(1)
            inv[k] = _ONE / np.float32(max(d, 1))
            step[k] = step[k] * np.float32(max(d, 1))
            e[k] = _ZERO
            nz[k] = 0
            num[k] = _ZERO
            den[k] = _ZERO
        for w in range(GROUP // 8):  # final levels, their error, the sums and pack_int4's word w
            for k in range(_B):
                st = step[k]
                iv = inv[k]
                ek = e[k]
                nk = nz[k]
                uk = num[k]
                dk = den[k]
                word = np.uint32(0)
                for t in range(8):
                    i = (8 * w + t) * _B + k
                    lf = np.rint(lv[i] * iv)  # exact: the gcd divides every level
                    lv[i] = lf
                    v = x[i]
                    d = abs(lf * st - v)
                    ek = d if d > ek else ek
                    nk += d != 0
                    dk += lf * lf  # exact in float32 for bf16 values: order does not matter
                    uk += v * lf
                    word |= np.uint32(np.int32(lf) + 8) << np.uint32(4 * t)  # nibble t: level 8w + t, +8
                e[k] = ek
                nz[k] = nk
                num[k] = uk
                den[k] = dk
                tpack[w * _B + k] = word
        refine = 0
        for k in range(_B):
            refine += (nz[k] != 0) & (ok[k] != 0)
        if refine:  # least squares on the inexact solved groups (values rounded to bf16)
            for k in range(_B):
                s[k] = num[k] / max(den[k], _ONE) if den[k] > 0 else step[k]
                bad[k] = 0
                e2[k] = _ZERO
            _lanes(s, safe, steptol)
            for h in range(GROUP // 8):  # the refined step must still fit, with the same levels
                for k in range(_B):
                    sk = s[k]
                    div = safe[k]
                    stol = steptol[k]
                    bk = bad[k]
                    ek = e2[k]
                    for t in range(8):
                        i = (8 * h + t) * _B + k
                        v = x[i]
                        d = abs(lv[i] * sk - v)
                        tol = max(abs(v) * _REL, stol)
                        bk |= (np.rint(v / div) != lv[i]) | (d > tol)
                        ek = d if d > ek else ek
                    bad[k] = bk
                    e2[k] = ek
            for k in range(_B):
                keep = (nz[k] != 0) & (ok[k] != 0) & (bad[k] == 0)
                step[k] = s[k] if keep else step[k]
                e[k] = e2[k] if keep else e[k]
        if want_levels:
            for i in range(_BLOCK):
                tlev[b * _BLOCK + i] = np.int8(lv[i])
        real = min(_B, nb - g0)  # the rest of the last block is padding
        missed = 0
        for k in range(real):
            steps[g0 + k] = step[k]
            solved[g0 + k] = ok[k] != 0
            maxerr[g0 + k] = e[k] if ok[k] else _ZERO
            missed += ok[k] == 0
        for k in range(real if missed else 0):
            if ok[k]:
                continue
            for j in range(GROUP):
                row[j] = x[j * _B + k]
            steps[g0 + k] = _unsolved(row, lev, amax[k], gcds)
            for w in range(GROUP // 8):
                word = np.uint32(0)
                for i in range(8):
                    if want_levels:
                        tlev[b * _BLOCK + (8 * w + i) * _B + k] = lev[8 * w + i]
                    word |= np.uint32(lev[8 * w + i] + 8) << np.uint32(4 * i)
                tpack[w * _B + k] = word
        for k in range(real):
            for w in range(GROUP // 8):
                packed[(g0 + k) * (GROUP // 8) + w] = tpack[w * _B + k]
    return 0


@numba.njit(**_JIT)
def summary(steps, solved, maxerr):  # pragma: no cover - compiled
    """(groups solved, max error, max error / step) of recover_bf16's per-group results, in one
    pass; the ratio in float32 against max(step, the smallest normal float32), as grid's is."""
    tiny = np.float32(np.finfo(np.float32).tiny)
    count = 0
    err = _ZERO
    rel = _ZERO
    for g in range(steps.shape[0]):
        count += solved[g]
        e = maxerr[g]
        err = max(err, e)
        rel = max(rel, e / max(steps[g], tiny))
    return count, err, rel


def _gcd_table() -> np.ndarray:
    """gcd of every subset of 0..8, indexed by its bit mask."""
    t = np.zeros(1 << 9, np.int8)
    for mask in range(1 << 9):
        t[mask] = math.gcd(*[v for v in range(9) if mask >> v & 1], 0)
    return t


_GCDS = _gcd_table()


def _transpose_in(bits: np.ndarray, s0: int, s1: int) -> np.ndarray:
    """Groups s0..s1 of bits [n, 32], zero-padded to whole blocks and transposed four values at a
    time: uint64 [blocks * 512], word [q * 64 + k] of a block holding values 4q..4q+3 of its
    group k (numpy's strided copy moves 8-byte words about twice as fast as 2-byte ones)."""
    blocks = -(-(s1 - s0) // _B)
    t = scratch.array("grid-in", (blocks, _QUADS, _B), np.uint64)
    full = (s1 - s0) // _B
    quads = bits.view(np.uint64)  # [n, 8]
    np.copyto(t[:full], quads[s0 : s0 + full * _B].reshape(full, _B, _QUADS).transpose(0, 2, 1))
    if full < blocks:  # the last, partial block
        pad = scratch.array("grid-pad", (_B, _QUADS), np.uint64)
        pad[:] = 0
        pad[: s1 - s0 - full * _B] = quads[s0 + full * _B : s1]
        np.copyto(t[full], pad.T)
    return t.reshape(-1)


def _untranspose(t: np.ndarray, out: np.ndarray) -> None:
    """Blocks [blocks, m, 64] (lane-major) back into rows [n, m]: one strided copy, no temporary."""
    n, m = out.shape
    full = n // _B
    np.copyto(out[: full * _B].reshape(full, _B, m), t[:full].transpose(0, 2, 1))
    if full * _B < n:
        out[full * _B :] = t[full].T[: n - full * _B]


def recover_bf16(bits: np.ndarray, reuse: bool = False, levels: bool = True) -> tuple | None:
    """bf16 groups as uint16 [n, 32] -> levels int8 [n, 32] (None unless ``levels``), packed int32
    [n, 4] (pack_int4's words), steps f32 [n], solved bool [n], max error f32 [n].

    None when a value is not finite (the caller then uses the reference). With ``reuse`` the
    outputs live in this thread's scratch buffers (repack.scratch).
    """
    n = bits.shape[0]
    blocks = -(-n // _B)
    tlev = scratch.array("grid-levels", (blocks, GROUP, _B) if levels else (0, GROUP, _B), np.int8)
    packed = scratch.fresh_or_reused(reuse, "packed", (n, GROUP // 8), np.uint32)
    steps = scratch.fresh_or_reused(reuse, "steps", (n,), np.float32)
    solved = scratch.fresh_or_reused(reuse, "solved", (n,), np.bool_)
    maxerr = scratch.fresh_or_reused(reuse, "maxerr", (n,), np.float32)
    bits = np.ascontiguousarray(bits)
    for s0 in range(0, n, _SUB):  # _SUB is a multiple of _B: sub-chunks start on a block
        s1 = min(n, s0 + _SUB)
        b0, b1 = s0 // _B, -(-s1 // _B)
        r = _recover(
            _transpose_in(bits, s0, s1),
            s1 - s0,
            levels,
            tlev[b0:b1].reshape(-1),
            packed[s0:s1].reshape(-1),
            steps[s0:s1],
            solved[s0:s1],
            maxerr[s0:s1],
            _GCDS,
        )
        if r < 0:
            return None
    lev = None
    if levels:
        lev = scratch.fresh_or_reused(reuse, "levels", (n, GROUP), np.int8)
        _untranspose(tlev, lev)
    return lev, packed.view(np.int32), steps, solved, maxerr
