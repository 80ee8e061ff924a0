"""Per-output-channel int8 quantization (W8A8 weights) in one compiled pass per row (numba).

``quantize_reference`` (torch) defines the result: scale = amax / 127 per row (1 for an all-zero
row), q = clamp(round(w / scale), -127, 127), and the largest |q * scale - w|. The kernel does the
same float32 operations per value, so q, scale and the error are bit-identical
(tests/unit/test_repack_int8_fast.py), in one read of the bf16 rows instead of a dozen passes
over a float32 copy.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from repack import scratch

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_127 = np.float32(127.0)


def quantize_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """[rows, cols] float -> (int8 q, float32 scale [rows, 1], max abs error) in torch."""
    w = w.to(torch.float32)
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale), -127, 127).to(torch.int8)
    err = (q.to(torch.float32) * scale - w).abs()
    return q, scale, float(err.max()) if err.numel() else 0.0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _quantize(bits, q, scale, errs):  # pragma: no cover - compiled
    """bits: bf16 as uint16 [rows, cols]. False if a value is not finite.

    Serial and GIL-free: the pipeline runs one call per worker thread on separate row chunks.
    """
    rows, cols = bits.shape
    bad = np.zeros(rows, np.uint8)
    x = np.empty(cols, np.float32)
    xu = x.view(np.uint32)
    for r in range(rows):
        for j in range(cols):
            xu[j] = np.uint32(bits[r, j]) << 16
        amax = _ZERO
        for j in range(cols):
            a = abs(x[j])
            amax = a if a > amax else amax
        if not np.isfinite(amax) or amax != amax:
            bad[r] = 1
            continue
        s = amax / _127 if amax > 0 else _ONE
        e = _ZERO
        for j in range(cols):
            v = min(max(np.rint(x[j] / s), -_127), _127)
            q[r, j] = np.int8(v)
            d = abs(v * s - x[j])
            e = d if d > e else e
        scale[r, 0] = s
        errs[r] = e
    return not bad.any()


def quantize(w: torch.Tensor, reuse: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
    """quantize_reference, compiled for bf16 rows (other dtypes and non-finite rows use torch).

    With ``reuse`` the int8 rows live in this thread's scratch buffer (repack.scratch).
    """
    if w.dtype != torch.bfloat16 or w.dim() != 2 or not w.numel():
        return quantize_reference(w)
    rows, cols = w.shape
    bits = w.contiguous().view(torch.int16).numpy().view(np.uint16)
    q = scratch.fresh_or_reused(reuse, "int8", (rows, cols), np.int8)
    scale = np.empty((rows, 1), np.float32)
    errs = np.empty(rows, np.float32)
    if not _quantize(bits, q, scale, errs):
        return quantize_reference(w)
    return torch.from_numpy(q), torch.from_numpy(scale), float(errs.max())
