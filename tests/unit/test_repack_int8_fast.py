"""The compiled int8 quantizer (int8_fast) equals its torch reference exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from repack import int8_fast


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


def test_other_dtypes_use_the_reference():
    w = torch.randn((4, 64), dtype=torch.float32)
    _same(w)
