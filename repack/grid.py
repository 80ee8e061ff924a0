"""Q4_0 grid: snapping values onto it (tiny models) and recovering it from bf16 values.

A group is 32 consecutive values along the input (last) axis; each value is ``level * step``
with an integer level in -8..7. The step is not ``amax / 8``: when a group's peak sits below
level 8 that divisor lands on a different grid and silently re-quantizes. Recovery tries
``amax / m`` for m = 1..8, keeps the first that reproduces the whole group, then refines the
step by least squares over the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from repack import finite

if TYPE_CHECKING:
    import torch

GROUP = 32
LEVEL_MIN = -8
LEVEL_MAX = 7
# A value reproduces when it is within this fraction of its own magnitude (one bf16 ulp is
# 2**-7 relative at worst) or, for values at or near zero, within this fraction of the step.
REL_TOL = 2.0**-7
STEP_TOL = 2.0**-6


class GridShapeError(ValueError):
    """A tensor's input axis is not a whole number of groups."""


@dataclass
class GridResult:
    """Recovered grid for a block of rows: levels [rows, cols] int8, steps [rows, cols/32] float32,
    packed [rows, cols/8] int32 (pack_int4's words).

    torch tensors from ``recover``, numpy arrays from ``recover_array``. ``levels`` is None when
    the caller asked only for the packed words (the converters); ``packed`` is None from
    ``recover_reference``.
    """

    levels: Any
    steps: Any
    off_grid: int
    groups: int
    max_abs_error: float
    max_rel_step_error: float
    packed: Any = None


def check_group_shape(name: str, shape: tuple[int, ...] | list[int], group: int = GROUP) -> None:
    """Raise GridShapeError unless ``shape`` is 2-D with an input axis divisible by ``group``."""
    if len(shape) != 2:
        raise GridShapeError(f"{name}: expected a 2-D [out, in] weight, got shape {list(shape)}")
    if shape[1] % group:
        raise GridShapeError(
            f"{name}: input axis {shape[1]} is not a multiple of the group size {group} (shape {list(shape)})"
        )


def _fits(x: torch.Tensor, tol_x: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Levels for ``step`` and a mask of groups that ``step`` reproduces. x: [G, 32], step: [G, 1]."""
    import torch

    safe = torch.where(step > 0, step, torch.ones_like(step))
    lv = torch.round(x / safe)
    tol = torch.maximum(tol_x, step * STEP_TOL)
    ok = ((lv * step - x).abs() <= tol) & (lv >= LEVEL_MIN) & (lv <= LEVEL_MAX)
    return lv, ok.all(dim=1)


def _gcd_rows(lv: torch.Tensor) -> torch.Tensor:
    """Greatest common divisor of each row of an integer tensor (0 for all-zero rows)."""
    import torch

    g = lv.abs()
    while g.shape[1] > 1:
        if g.shape[1] % 2:
            g = torch.cat([g, torch.zeros_like(g[:, :1])], dim=1)
        g = torch.gcd(g[:, 0::2], g[:, 1::2])
    return g


def _fast(bits: np.ndarray, rows: int, cols: int, reuse: bool, levels: bool) -> GridResult | None:
    """The compiled kernel on bf16 bits [rows, cols] (numpy arrays out); None if a value is not finite."""
    from repack import grid_fast  # numba's import is paid only by steps that recover grids

    fast = grid_fast.recover_bf16(bits.reshape(-1, GROUP), reuse, levels)
    if fast is None:
        return None
    lev, packed, steps, solved, maxerr = fast
    n = steps.shape[0]
    count, err, rel = grid_fast.summary(steps, solved, maxerr)
    return GridResult(
        levels=None if lev is None else lev.reshape(rows, cols),
        packed=packed.reshape(rows, cols // 8),
        steps=steps.reshape(rows, cols // GROUP),
        off_grid=int(n - count),
        groups=n,
        max_abs_error=float(err),
        max_rel_step_error=float(rel),
    )


def recover_array(block: np.ndarray, dtype: str, reuse: bool = False, levels: bool = True) -> GridResult:
    """``recover`` for a numpy block [rows, cols] in safetensors dtype ``dtype``'s storage (bf16 as
    uint16 bits), with numpy arrays out and ``packed`` always set: what the converters call.

    bf16 takes the compiled kernel; other float dtypes take the torch reference (torch is
    imported only then). A NaN or Inf raises finite.NonFiniteError: no grid holds one, and
    calling it "off the grid" hid what was wrong (the kernel's peak pass already finds it).
    """
    rows, cols = block.shape
    if dtype == "BF16":
        r = _fast(np.ascontiguousarray(block), rows, cols, reuse, levels)
        if r is None:
            raise finite.error(block, dtype)
        return r
    finite.check(block, dtype)
    from repack.packing import pack_int4
    from repack.torch_bf16 import to_torch

    ref = recover_reference(to_torch(block, dtype))
    return GridResult(
        levels=ref.levels.numpy() if levels else None,
        packed=pack_int4(ref.levels).numpy(),
        steps=ref.steps.numpy(),
        off_grid=ref.off_grid,
        groups=ref.groups,
        max_abs_error=ref.max_abs_error,
        max_rel_step_error=ref.max_rel_step_error,
    )


def recover(block: torch.Tensor, group: int = GROUP, reuse: bool = False, levels: bool = True) -> GridResult:
    """Recover levels and steps of a [rows, cols] block; off-grid groups are counted, not raised.

    bf16 blocks of 32-value groups go through the compiled kernel (grid_fast), which gives the
    same result as ``recover_reference`` bit for bit at GB/s; other dtypes, other group sizes
    and blocks with non-finite values take the reference. With ``reuse`` the kernel's outputs
    live in this thread's scratch buffers (repack.scratch: consume them before the next chunk).
    Without ``levels`` the fast path skips them and returns only ``packed`` (the reference
    path always has both).
    """
    import torch

    if block.dtype == torch.bfloat16 and group == GROUP and block.dim() == 2:
        rows, cols = block.shape
        from repack.torch_bf16 import bits

        r = _fast(bits(block), rows, cols, reuse, levels)
        if r is not None:
            r.levels = None if r.levels is None else torch.from_numpy(r.levels)
            r.packed, r.steps = torch.from_numpy(r.packed), torch.from_numpy(r.steps)
            return r
    return recover_reference(block, group)


def recover_reference(block: torch.Tensor, group: int = GROUP) -> GridResult:
    """Recover levels and steps of a [rows, cols] block in torch (the definition ``recover`` keeps).

    Every peak level L in 1..8 has a multiple in 4..8 that keeps a positive peak at or below 7,
    so trying m = 8, 7, 6, 5, 4 finds a grid
    for every on-grid group; dividing the levels by their common divisor then gives the
    coarsest grid, which is the QAT step itself whenever the group's levels share no factor.
    """
    import torch

    rows, cols = block.shape
    x = block.to(torch.float32).reshape(-1, group)
    n = x.shape[0]
    ax = x.abs()
    amax = ax.amax(dim=1, keepdim=True)
    tol_x = ax.mul_(REL_TOL)  # per-value tolerance, computed once
    # First candidate on every group without gathering: most groups of a QAT tensor fit it.
    step8 = amax / 8
    lv, solved = _fits(x, tol_x, step8)
    levels = lv.to(torch.int32)
    steps = step8.clone()
    solved |= amax.squeeze(1) == 0  # all-zero groups: level 0, step 0
    for m in (7, 6, 5, 4):
        todo = (~solved).nonzero().squeeze(1)
        if todo.numel() == 0:
            break
        step = amax[todo] / m
        lv, ok = _fits(x[todo], tol_x[todo], step)
        idx = todo[ok]
        levels[idx] = lv[ok].to(torch.int32)
        steps[idx] = step[ok]
        solved[idx] = True
    g = _gcd_rows(levels)
    coarse = (g > 1).squeeze(1)
    if coarse.any():
        levels[coarse] = levels[coarse] // g[coarse]
        steps[coarse] = steps[coarse] * g[coarse].to(torch.float32)
    # Least squares refines steps whose values were rounded to bf16 (real QAT steps are not
    # always bf16-representable); keep the refined step only where it still reproduces. Only
    # inexact groups are refined, each on its own, so a group's result never depends on which
    # other groups share the block (the converters feed row chunks of any size).
    lvf = levels.to(torch.float32)
    err = (lvf * steps - x).abs()
    inexact = solved & (err > 0).any(dim=1)
    if bool(inexact.any()):
        den = (lvf * lvf).sum(dim=1, keepdim=True)
        refined = torch.where(den > 0, (x * lvf).sum(dim=1, keepdim=True) / den.clamp_min(1), steps)
        lv2, ok = _fits(x, tol_x, refined)
        better = ok & inexact & (lv2.to(torch.int32) == levels).all(dim=1)
        steps[better] = refined[better]
        err = (lvf * steps - x).abs()
    off = int((~solved).sum())
    err[~solved] = 0
    rel = err / steps.clamp_min(torch.finfo(torch.float32).tiny)
    return GridResult(
        levels=levels.to(torch.int8).reshape(rows, cols),
        steps=steps.reshape(rows, cols // group),
        off_grid=off,
        groups=n,
        max_abs_error=float(err.max()) if n else 0.0,
        max_rel_step_error=float(rel.max()) if n else 0.0,
    )


def dequantize(levels: torch.Tensor, steps: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """levels [rows, cols] int, steps [rows, cols/group] -> float32 values."""
    import torch

    rows, cols = levels.shape
    lv = levels.to(torch.float32).reshape(rows, cols // group, group)
    return (lv * steps.to(torch.float32).unsqueeze(-1)).reshape(rows, cols)


def random_on_grid(
    shape: tuple[int, int], gen: torch.Generator, exponent: int = -10, group: int = GROUP
) -> torch.Tensor:
    """A bf16 tensor whose every group lies on a Q4_0 grid, with peaks at every level 1..8.

    Steps are ``k * 2**exponent`` with k in 8..15 (four significant bits), so every
    ``level * step`` (at most 7 significant bits) is exact in bf16. One group in 64 is all
    zeros; the rest draw a peak level uniformly from 1..8 and reach it exactly once or more.
    """
    import torch

    rows, cols = shape
    g = rows * cols // group
    k = torch.randint(8, 16, (g, 1), generator=gen).to(torch.float32)
    step = k * (2.0**exponent)
    peak = torch.randint(1, 9, (g, 1), generator=gen)
    u = torch.rand((g, group), generator=gen)
    # Uniform levels in [-peak, min(peak, 7)]; level +8 is not representable.
    hi = torch.clamp(peak, max=LEVEL_MAX)
    lv = torch.floor(u * (hi + peak + 1).to(torch.float32)) - peak.to(torch.float32)
    # Make the peak actually occur: +peak if representable (random sign), else -8.
    pos = torch.randint(0, group, (g, 1), generator=gen)
    sign = torch.where(torch.rand((g, 1), generator=gen) < 0.5, -1.0, 1.0)
    sign = torch.where(peak == 8, torch.full_like(sign, -1.0), sign)
    lv.scatter_(1, pos, sign * peak.to(torch.float32))
    zero = torch.rand((g, 1), generator=gen) < 1.0 / 64
    lv = torch.where(zero, torch.zeros_like(lv), lv)
    return (lv * step).reshape(rows, cols).to(torch.bfloat16)
