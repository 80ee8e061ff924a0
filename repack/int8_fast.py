"""Per-output-channel int8 quantization (W8A8 weights) in one compiled pass per row (numba).

``quantize_reference`` (torch) defines the result. Per row:

- step: amax / 127 in float32, rounded to the nearest bfloat16 (ties to even, as a plain cast
  does); 1 for an all-zero row. The checkpoint stores the step as bf16 ``weight_scale[out, 1]``
  (the published W8A8 card's format), so the int8 values are chosen against that stored step,
  not the float32 one.
- q = clamp(round half to even(w / step), -127, 127), w in float32.
- the largest |q * step - w|, and the row's sums of (q * step - w)^2 and of w^2 in float64, from
  which ``repack.int8_error`` makes the relative error.

Rounding the step to nearest can make it smaller than amax / 127, by at most half a bf16 ulp,
2**-8 of it, for a normal number. Then |w| / step <= 127 / (1 - 2**-8) = 127.498 (plus float32
rounding, far below the 0.002 left), which still rounds to 127: the clamp never changes a value
and every value stays within half a step of q * step. Only a subnormal step (a row whose amax is
below 127 * 2**-126, about 1.5e-36; no trained weight has such a row) has fewer bits and can
round further: there the clamp keeps q in range, and a step that rounds to zero is taken as the
smallest bf16 value, 2**-133, so no division by zero. Rounding the step up instead would need
neither guard, but it moves the step 0.3% up on average, and on values already on the QAT's
4-bit grid it raised the relative error by 1-4% of itself (0.744% to 0.765% on a 256 x 1536
QAT-like tensor), not the 0.3% it costs on plain Gaussian values: the grid's values line up
with the int8 levels better at the nearest step.

The kernel does the same float32 operations per value, so q, the step and the largest error are
bit-identical (tests/unit/test_repack_int8_fast.py), in one read of the bf16 rows instead of a
dozen passes over a float32 copy. Its loops are flat and its maxima integer maxima over float
bits (the same order as the floats' for finite, non-negative values), so LLVM makes them SIMD
code. The float64 sums of squares (``_sq_sum``) may be reassociated into SIMD lanes, and the
reference sums in torch's own order, so those agree to float64 rounding, not bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numba
import numpy as np

from repack import finite, scratch

if TYPE_CHECKING:
    import torch

_ONE = np.float32(1.0)
_127 = np.float32(127.0)
ONE_BF16 = 0x3F80  # 1.0 in bf16: the step of an all-zero row
TINY_BF16 = 0x0001  # 2**-133, the smallest bf16 value: the step where amax / 127 rounds to zero


class Int8Block(NamedTuple):
    """One block of rows, quantized.

    ``scale`` is bf16 [rows, 1]: torch.bfloat16 from ``quantize``/``quantize_reference``, its
    uint16 bits (the converters' BF16 storage) from ``quantize_array``. ``err_sq`` and ``ref_sq``
    are the block's sums of (q * scale - w)^2 and w^2 in float64 (``repack.int8_error``).
    """

    q: np.ndarray | torch.Tensor
    scale: np.ndarray | torch.Tensor
    max_abs_error: float
    err_sq: float
    ref_sq: float


def bf16_step(amax: torch.Tensor) -> torch.Tensor:
    """amax / 127 (float32, finite, non-negative) rounded to the nearest bf16, as torch.bfloat16;
    1 where amax is 0, the smallest bf16 value where the quotient rounds to 0 (module docstring)."""
    import torch

    step = (amax / 127.0).to(torch.bfloat16)
    tiny = torch.tensor(TINY_BF16, dtype=torch.int16).view(torch.bfloat16)
    step = torch.where(step > 0, step, tiny)
    return torch.where(amax > 0, step, torch.ones_like(step))


def quantize_reference(w: torch.Tensor) -> Int8Block:
    """[rows, cols] float -> Int8Block (int8 q, bf16 scale [rows, 1], errors) in torch."""
    import torch

    w = w.to(torch.float32)
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = bf16_step(amax)
    s = scale.to(torch.float32)
    q = torch.clamp(torch.round(w / s), -127, 127).to(torch.int8)
    diff = q.to(torch.float32) * s - w
    err = diff.abs()
    return Int8Block(
        q,
        scale,
        float(err.max()) if err.numel() else 0.0,
        float(diff.double().square().sum()),
        float(w.double().square().sum()),
    )


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sq_sum(a):  # pragma: no cover - compiled
    """The sum of squares of a float32 row, in float64.

    ``reassoc`` (this function only) lets LLVM add in SIMD lanes: a strict left-to-right float64
    sum made the whole kernel several times slower. The order then depends on the CPU's vector
    width only, so a run is the same on one machine whatever --jobs; another CPU may differ in
    the last bits of a diagnostic figure (never in the weights written).
    """
    t = 0.0
    for j in range(a.shape[0]):
        v = np.float64(a[j])
        t += v * v
    return t


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _quantize(bits, cols, q, scale, errs, sums):  # pragma: no cover - compiled
    """bits: bf16 as uint16, flat [rows * cols]; q flat; scale bf16 bits [rows]; errs [rows]
    float32; sums [rows, 2] float64 (error, reference). False if a value is not finite.

    Serial and GIL-free: the pipeline runs one call per worker thread on separate row chunks.
    """
    rows = bits.shape[0] // cols
    x = np.empty(cols, np.float32)
    xu = x.view(np.uint32)
    d = np.empty(cols, np.float32)
    du = d.view(np.uint32)
    one = np.empty(1, np.float32)
    oneu = one.view(np.uint32)
    for r in range(rows):
        base = r * cols
        m = np.uint32(0)
        for j in range(cols):
            u = np.uint32(bits[base + j]) << 16
            xu[j] = u
            a = u & np.uint32(0x7FFFFFFF)
            m = a if a > m else m
        if m >= np.uint32(0x7F800000):  # inf or NaN
            return False
        sb = np.uint32(ONE_BF16)
        if m > 0:
            oneu[0] = m
            one[0] = one[0] / _127
            t = oneu[0]  # round to nearest bf16, ties to even (bf16_step)
            sb = (t + np.uint32(0x7FFF) + ((t >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            sb = sb if sb > 0 else np.uint32(TINY_BF16)
        oneu[0] = sb << np.uint32(16)
        s = one[0]
        for j in range(cols):
            v = min(max(np.rint(x[j] / s), -_127), _127)
            q[base + j] = np.int8(v)
            d[j] = v * s - x[j]
        me = np.uint32(0)
        for j in range(cols):
            a = du[j] & np.uint32(0x7FFFFFFF)  # |d|: the sign bit off
            me = a if a > me else me
        oneu[0] = me
        scale[r] = np.uint16(sb)
        errs[r] = one[0]
        sums[r, 0] = _sq_sum(d)
        sums[r, 1] = _sq_sum(x)
    return True


def quantize_array(w: np.ndarray, dtype: str, reuse: bool = False) -> Int8Block:
    """``quantize`` for a numpy [rows, cols] block in safetensors dtype ``dtype``'s storage (bf16 as
    uint16 bits): what the converters call. The scale comes back as bf16 bits (uint16 [rows, 1]).
    Only bf16 is compiled; other dtypes take the torch reference (torch is imported only then).
    A NaN or Inf raises finite.NonFiniteError (the reference would write a NaN row as zeros with
    scale 1, an Inf row with scale inf). With ``reuse`` the int8 rows live in this thread's
    scratch buffer (repack.scratch).
    """
    if dtype == "BF16" and w.ndim == 2 and w.size:
        rows, cols = w.shape
        q = scratch.fresh_or_reused(reuse, "int8", (rows, cols), np.int8)
        scale = np.empty((rows, 1), np.uint16)
        errs = np.empty(rows, np.float32)
        sums = np.empty((rows, 2), np.float64)
        if _quantize(np.ascontiguousarray(w).reshape(-1), cols, q.reshape(-1), scale.reshape(-1), errs, sums):
            # Row sums added in row order (numpy's pairwise sum over a fixed array): a fixed order.
            return Int8Block(q, scale, float(errs.max()), float(sums[:, 0].sum()), float(sums[:, 1].sum()))
        raise finite.error(w, dtype)
    finite.check(w, dtype)
    from repack.torch_bf16 import bits, to_torch

    r = quantize_reference(to_torch(w, dtype))
    return r._replace(q=r.q.numpy(), scale=bits(r.scale))


def quantize(w: torch.Tensor, reuse: bool = False) -> Int8Block:
    """quantize_reference, compiled for bf16 rows (other dtypes use torch; NaN or Inf in a bf16
    block raises finite.NonFiniteError)."""
    import torch

    if w.dtype != torch.bfloat16 or w.dim() != 2 or not w.numel():
        return quantize_reference(w)
    from repack.torch_bf16 import bits, to_torch

    r = quantize_array(bits(w), "BF16", reuse)
    return r._replace(q=torch.from_numpy(r.q), scale=to_torch(r.scale, "BF16"))
