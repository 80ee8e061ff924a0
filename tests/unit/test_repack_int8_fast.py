"""The int8 quantizer (int8_fast): the compiled kernel equals its torch reference exactly, and every
dtype's path gives the documented result, checked against values written out in this file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repack import int8_fast
from repack.torch_bf16 import bits


def _same(w: torch.Tensor) -> None:
    q, s, e = int8_fast.quantize(w)
    rq, rs, re_ = int8_fast.quantize_reference(w)
    assert q.dtype == rq.dtype == torch.int8 and s.dtype == rs.dtype == torch.float32
    assert torch.equal(q, rq) and torch.equal(s, rs) and e == re_


@pytest.mark.parametrize("seed", [0, 1])
def test_random_rows(seed):
    gen = torch.Generator().manual_seed(seed)
    _same((torch.randn((67, 1536), generator=gen) * 0.03).to(torch.bfloat16))


def test_zero_rows_tiny_values_and_ties():
    w = torch.zeros((5, 256), dtype=torch.bfloat16)
    w[1, 7] = 1e-39  # subnormal
    w[2] = torch.linspace(-1, 1, 256).to(torch.bfloat16)  # many values near .5 ties
    w[3, :] = 0.5
    w[4, ::2] = -2.0
    w[4, 1::2] = 1.0
    _same(w)


def test_compiled_path_runs_and_non_finite_falls_back():
    w = torch.ones((2, 64), dtype=torch.bfloat16)
    bits = w.view(torch.int16).numpy().view("uint16").reshape(-1)
    q = np.empty(2 * 64, np.int8)
    s = np.empty(2, np.float32)
    e = np.empty(2, np.float32)
    assert int8_fast._quantize(bits, 64, q, s, e)
    w[1, 3] = float("inf")
    bits = w.view(torch.int16).numpy().view("uint16").reshape(-1)
    assert not int8_fast._quantize(bits, 64, q, s, e)
    _same(w[:1])


def _written_out(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The documented result, computed here in numpy float32 without repack's code.

    scale = amax / 127 per row (1 for an all-zero row); q = clamp(round half to even(w / scale),
    -127, 127); the error is the largest |q * scale - w|.
    """
    x = w.astype(np.float32)
    amax = np.abs(x).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
    err = float(np.abs(q.astype(np.float32) * scale - x).max())
    return q, scale, err


def test_written_out_expectation_on_values_worked_by_hand():
    # Row 0: amax 127 -> scale 1; 63.5 and 0.5 are ties (to even: 64 and 0), 1.5 -> 2.
    # Row 1: all zero -> scale 1, q 0. Row 2: amax 2.54 -> scale 0.02; -2.54 -> -127.
    w = np.array([[-127.0, 63.5, 0.5, 1.5], [0, 0, 0, 0], [-2.54, 0, 0, 0]], np.float32)
    q, scale, err = _written_out(w)
    assert q.tolist() == [[-127, 64, 0, 2], [0, 0, 0, 0], [-127, 0, 0, 0]]
    assert scale[:2, 0].tolist() == [1.0, 1.0] and scale[2, 0] == np.float32(2.54) / np.float32(127)
    assert err == 0.5


@pytest.mark.parametrize(
    ("dtype", "storage"), [(torch.float32, "F32"), (torch.float16, "F16"), (torch.bfloat16, "BF16")]
)
def test_every_dtype_gives_the_documented_result(dtype, storage):
    # float32 and float16 rows skip the compiled kernel (bf16 rows take it); every path must give
    # amax/127 scales and round-half-to-even levels, checked against a value written out here.
    gen = torch.Generator().manual_seed(2)
    w = (torch.randn((6, 64), generator=gen) * 0.03).to(dtype)
    w[1] = 0  # an all-zero row: scale 1
    # Exact ties in every dtype: scale 2**-6, so w / scale is exactly 63.5, 0.5, 1.5, 2.5.
    w[2] = 0
    w[2, :5] = torch.tensor([-127.0, 63.5, 0.5, 1.5, 2.5]) * 2**-6
    want_q, want_s, want_e = _written_out(w.float().numpy())
    q, s, e = int8_fast.quantize(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert np.array_equal(q.numpy(), want_q) and np.array_equal(s.numpy(), want_s) and e == want_e
    # What the converters call: the numpy storage of a safetensors tensor of that dtype.
    aq, as_, ae = int8_fast.quantize_array(bits(w) if storage == "BF16" else w.numpy(), storage)
    assert np.array_equal(aq, want_q) and np.array_equal(as_, want_s) and ae == want_e
