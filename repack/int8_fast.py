"""Per-output-channel int8 quantization (W8A8 weights) in one compiled pass per row (numba).

``quantize_reference`` (torch) defines the result: scale = amax / 127 per row (1 for an all-zero
row), q = clamp(round(w / scale), -127, 127), and the largest |q * scale - w|. The kernel does the
same float32 operations per value, so q, scale and the error are bit-identical
(tests/unit/test_repack_int8_fast.py), in one read of the bf16 rows instead of a dozen passes
over a float32 copy. Its loops are flat and its maxima integer maxima over float bits (the same
order as the floats' for finite, non-negative values), so LLVM makes them SIMD code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np

from repack import finite, scratch

if TYPE_CHECKING:
    import torch

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_127 = np.float32(127.0)


def quantize_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """[rows, cols] float -> (int8 q, float32 scale [rows, 1], max abs error) in torch."""
    import torch

    w = w.to(torch.float32)
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale), -127, 127).to(torch.int8)
    err = (q.to(torch.float32) * scale - w).abs()
    return q, scale, float(err.max()) if err.numel() else 0.0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _quantize(bits, cols, q, scale, errs):  # pragma: no cover - compiled
    """bits: bf16 as uint16, flat [rows * cols]; q flat. False if a value is not finite.

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
        oneu[0] = m
        amax = one[0]
        s = amax / _127 if amax > 0 else _ONE
        for j in range(cols):
            v = min(max(np.rint(x[j] / s), -_127), _127)
            q[base + j] = np.int8(v)
            d[j] = abs(v * s - x[j])
        e = np.uint32(0)
        for j in range(cols):
            e = du[j] if du[j] > e else e
        oneu[0] = e
        scale[r] = s
        errs[r] = one[0]
    return True


def quantize_array(w: np.ndarray, dtype: str, reuse: bool = False) -> tuple[np.ndarray, np.ndarray, float]:
    """``quantize`` for a numpy [rows, cols] block in safetensors dtype ``dtype``'s storage (bf16 as
    uint16 bits): what the converters call. Only bf16 is compiled; other dtypes take the torch
    reference (torch is imported only then). A NaN or Inf raises finite.NonFiniteError (the
    reference would write a NaN row as zeros with scale 1, an Inf row with scale inf). With
    ``reuse`` the int8 rows live in this thread's scratch buffer (repack.scratch).
    """
    if dtype == "BF16" and w.ndim == 2 and w.size:
        rows, cols = w.shape
        q = scratch.fresh_or_reused(reuse, "int8", (rows, cols), np.int8)
        scale = np.empty((rows, 1), np.float32)
        errs = np.empty(rows, np.float32)
        if _quantize(np.ascontiguousarray(w).reshape(-1), cols, q.reshape(-1), scale.reshape(-1), errs):
            return q, scale, float(errs.max())
        raise finite.error(w, dtype)
    finite.check(w, dtype)
    from repack.torch_bf16 import to_torch

    rq, rs, re_ = quantize_reference(to_torch(w, dtype))
    return rq.numpy(), rs.numpy(), re_


def quantize(w: torch.Tensor, reuse: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
    """quantize_reference, compiled for bf16 rows (other dtypes use torch; NaN or Inf in a bf16
    block raises finite.NonFiniteError)."""
    import torch

    if w.dtype != torch.bfloat16 or w.dim() != 2 or not w.numel():
        return quantize_reference(w)
    from repack.torch_bf16 import bits

    q, scale, err = quantize_array(bits(w), "BF16", reuse)
    return torch.from_numpy(q), torch.from_numpy(scale), err
