"""float32 -> float16 (IEEE binary16, round to nearest even) compiled with numba.

numpy's ``astype(np.float16)`` converts one value at a time in C (about 1.8 ns a value here);
the converters turn every group's step into a float16 scale, 290 million of them for E2B, so
this SIMD-friendly twin, bit-identical to numpy's for every input (NaN payloads included),
saves about half a second of CPU on a full conversion.
"""

from __future__ import annotations

import numba
import numpy as np

_JIT = {"cache": True, "nogil": True, "error_model": "numpy"}


@numba.njit(inline="always", **_JIT)
def _bits(u):  # pragma: no cover - compiled
    """The float16 bits of the float32 whose bits are ``u`` (uint32)."""
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    mant = a & np.uint32(0x7FFFFF)
    # Normal halves: rebias the exponent, round the 13 dropped bits to nearest even.
    normal = (
        a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1)) - np.uint32(0x38000000)
    ) >> np.uint32(13)
    # Subnormal halves: the 24-bit significand shifted right by 126 - exponent (14..24), rounded.
    e = a >> np.uint32(23)
    s = np.uint32(126) - min(max(e, np.uint32(102)), np.uint32(112))
    m = mant | np.uint32(0x800000)
    sub = (m + (np.uint32(1) << (s - np.uint32(1))) - np.uint32(1) + ((m >> s) & np.uint32(1))) >> s
    nan = np.uint32(0x7C00) | (mant >> np.uint32(13))
    nan = nan + np.uint32(nan == np.uint32(0x7C00))  # a payload only in the dropped bits stays a NaN
    h = normal
    h = sub if a < np.uint32(0x38800000) else h
    h = np.uint32(0) if a < np.uint32(0x33000001) else h  # at or below 2**-25: rounds to zero
    h = np.uint32(0x7C00) if a >= np.uint32(0x477FF000) else h  # 65520 and up: infinity
    h = nan if a > np.uint32(0x7F800000) else h
    return np.uint16(sign | h)


@numba.njit(**_JIT)
def _convert(src, out):  # pragma: no cover - compiled
    for i in range(src.shape[0]):
        out[i] = _bits(src[i])


def from_float32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 array -> float16 array of the same shape (into ``out`` when given)."""
    x = np.ascontiguousarray(x, np.float32)
    if out is None:
        out = np.empty(x.shape, np.float16)
    _convert(x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16))
    return out
