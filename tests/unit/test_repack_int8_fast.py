"""The int8 quantizer (int8_fast): the compiled kernel equals its torch reference exactly, and every
dtype's path gives the documented result, checked against values written out in this file."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from repack import int8_fast
from repack.torch_bf16 import bits


def _same(w: torch.Tensor) -> None:
    got = int8_fast.quantize(w)
    ref = int8_fast.quantize_reference(w)
    assert got.q.dtype == ref.q.dtype == torch.int8 and got.scale.dtype == ref.scale.dtype == torch.bfloat16
    assert torch.equal(got.q, ref.q) and np.array_equal(bits(got.scale), bits(ref.scale))
    assert got.max_abs_error == ref.max_abs_error
    # The sums of squares are float64 in another order (SIMD lanes against torch's): equal to rounding.
    assert got.err_sq == pytest.approx(ref.err_sq, rel=1e-12, abs=1e-300)
    assert got.ref_sq == pytest.approx(ref.ref_sq, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_rows(seed):
    gen = torch.Generator().manual_seed(seed)
    _same((torch.randn((67, 1536), generator=gen) * 0.03).to(torch.bfloat16))


def test_zero_rows_tiny_values_and_ties():
    w = torch.zeros((7, 256), dtype=torch.bfloat16)
    w[1, 7] = 1e-39  # subnormal: amax / 127 rounds to 0 in bf16, the step is 2**-133
    w[2] = torch.linspace(-1, 1, 256).to(torch.bfloat16)  # many values near .5 ties
    w[3, :] = 0.5
    w[4, ::2] = -2.0
    w[4, 1::2] = 1.0
    w[5, 3] = 5e-38  # a subnormal step of a few bits: amax / step is 136, the clamp keeps 127
    w[6, :] = -3e-38
    _same(w)
    r = int8_fast.quantize(w)
    assert bits(r.scale)[1, 0] == int8_fast.TINY_BF16 and r.q[1, 7] == 11
    assert w[5, 3].float() / r.scale[5, 0].float() == 136 and r.q[5, 3] == 127


def test_compiled_path_runs_and_non_finite_falls_back():
    w = torch.ones((2, 64), dtype=torch.bfloat16)
    b = bits(w).reshape(-1)
    q = np.empty(2 * 64, np.int8)
    s = np.empty(2, np.uint16)
    e = np.empty(2, np.float32)
    sums = np.empty((2, 2), np.float64)
    assert int8_fast._quantize(b, 64, q, s, e, sums)
    w[1, 3] = float("inf")
    assert not int8_fast._quantize(bits(w).reshape(-1), 64, q, s, e, sums)
    _same(w[:1])


def _bf16_nearest(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bf16 value (ties to even), as float32, by comparing the two
    neighbours (written without repack's bit trick)."""
    u = x.astype(np.float32).view(np.uint32)
    lo = (u & np.uint32(0xFFFF0000)).view(np.float32)
    hi = ((u & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(np.float32)
    dlo, dhi = x - lo, hi - x
    even_lo = ((u >> 16) & 1) == 0
    return np.where((dlo < dhi) | ((dlo == dhi) & even_lo), lo, hi).astype(np.float32)


def _written_out(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The documented result, computed here in numpy without repack's code.

    step = amax / 127 per row rounded to the nearest bf16 (1 for an all-zero row); q =
    clamp(round half to even(w / step), -127, 127); the largest |q * step - w|; the relative
    error ||q * step - w|| / ||w|| in percent.
    """
    x = w.astype(np.float32)
    amax = np.abs(x).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, _bf16_nearest(amax / np.float32(127)), np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
    d = q.astype(np.float32) * scale - x
    rel = 100 * math.sqrt(np.sum(d.astype(np.float64) ** 2) / np.sum(x.astype(np.float64) ** 2))
    return q, scale, float(np.abs(d).max()), rel


def test_written_out_expectation_on_values_worked_by_hand():
    # Row 0: amax 127 -> step 1; 63.5 and 0.5 are ties (to even: 64 and 0), 1.5 -> 2.
    # Row 1: all zero -> step 1, q 0. Row 2: amax 3 -> 3 / 127 = 193.51 * 2**-13, whose nearest
    # bf16 is 194 * 2**-13 (0x3CC2), a little above: -3 -> -126.68 -> -127.
    # Row 3: amax 1.0078125 -> 130.02 * 2**-14 rounds down to 130 * 2**-14 (0x3C02), below
    # amax / 127: 1.0078125 / step = 127.02, which still rounds to 127 (int8_fast's bound).
    # Every value is exact in bf16, so the kernel sees the same numbers.
    w = np.array([[-127.0, 63.5, 0.5, 1.5], [0, 0, 0, 0], [-3.0, 0, 0, 0], [1.0078125, 0, 0, 0]], np.float32)
    q, scale, err, _ = _written_out(w)
    assert q.tolist() == [[-127, 64, 0, 2], [0, 0, 0, 0], [-127, 0, 0, 0], [127, 0, 0, 0]]
    assert scale[:, 0].view(np.uint32).tolist() == [0x3F800000, 0x3F800000, 0x3CC20000, 0x3C020000]
    amax_over_127 = np.abs(w).max(axis=1) / np.float32(127)  # rows 2 and 3: above, then below
    assert scale[2, 0] > amax_over_127[2] and scale[3, 0] < amax_over_127[3]
    assert err == 0.5
    got = int8_fast.quantize(torch.from_numpy(w).to(torch.bfloat16))
    assert got.q.tolist() == q.tolist()
    assert bits(got.scale).reshape(-1).tolist() == [0x3F80, 0x3F80, 0x3CC2, 0x3C02]


@pytest.mark.parametrize(
    ("dtype", "storage"), [(torch.float32, "F32"), (torch.float16, "F16"), (torch.bfloat16, "BF16")]
)
def test_every_dtype_gives_the_documented_result(dtype, storage):
    # float32 and float16 rows skip the compiled kernel (bf16 rows take it); every path must give
    # bf16 steps of amax/127 and round-half-to-even levels, checked against a value written out here.
    gen = torch.Generator().manual_seed(2)
    w = (torch.randn((6, 64), generator=gen) * 0.03).to(dtype)
    w[1] = 0  # an all-zero row: step 1
    # Exact ties in every dtype: step 2**-6, so w / step is exactly 63.5, 0.5, 1.5, 2.5.
    w[2] = 0
    w[2, :5] = torch.tensor([-127.0, 63.5, 0.5, 1.5, 2.5]) * 2**-6
    want_q, want_s, want_e, want_rel = _written_out(w.float().numpy())
    got = int8_fast.quantize(w)
    assert got.q.dtype == torch.int8 and got.scale.dtype == torch.bfloat16 and got.scale.shape == (6, 1)
    assert np.array_equal(got.q.numpy(), want_q) and np.array_equal(got.scale.float().numpy(), want_s)
    assert got.max_abs_error == want_e
    assert 100 * math.sqrt(got.err_sq / got.ref_sq) == pytest.approx(want_rel, rel=1e-9)
    # What the converters call: the numpy storage of a safetensors tensor of that dtype; the
    # step comes back as bf16 bits.
    a = int8_fast.quantize_array(bits(w) if storage == "BF16" else w.numpy(), storage)
    assert a.scale.dtype == np.uint16 and a.scale.shape == (6, 1)
    assert np.array_equal(a.q, want_q)
    assert np.array_equal(a.scale.astype(np.uint32) << 16, want_s.view(np.uint32))
    assert a.max_abs_error == want_e


def test_no_level_passes_127_and_every_value_is_within_half_a_step():
    # Rows whose amax / 127 rounds *down* to bf16 (the step is then below amax / 127): the peak
    # must still land on +-127, and every value within half of the stored step.
    gen = torch.Generator().manual_seed(3)
    w = torch.randn((512, 256), generator=gen) * 0.05
    w[:, 0] = torch.linspace(0.01, 3.0, 512)  # amaxes across many bf16 steps, up and down
    w = w.to(torch.bfloat16)
    amax = w.float().abs().amax(1, keepdim=True)
    r = int8_fast.quantize(w)
    s = r.scale.float()
    assert (s < amax / 127).any() and (s > amax / 127).any()  # both roundings occur
    assert r.q.abs().amax(1).eq(127).all()  # the peak of every row is +-127
    assert ((r.q.float() * s - w.float()).abs() <= s * 0.5).all()
