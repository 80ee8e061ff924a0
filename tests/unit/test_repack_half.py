"""The compiled float32 -> float16 conversion equals numpy's, bit for bit."""

from __future__ import annotations

import warnings

import numpy as np

from repack import half


def _numpy(bits: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow to inf is the point here
        return bits.view(np.float32).astype(np.float16).view(np.uint16)


def test_every_exponent_and_rounding_boundary():
    # Every exponent (zero, subnormal, normal, the overflow edge, inf, NaN), both signs, with
    # the significands where rounding to 10 bits changes: ties, one either side, all ones.
    rng = np.random.default_rng(0)
    edges = [0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x400000, 0x7FEFFF, 0x7FF000, 0x7FFFFF]
    mants = np.concatenate([np.array(edges, np.uint32), rng.integers(0, 1 << 23, 2000, dtype=np.uint32)])
    exps = np.arange(256, dtype=np.uint32)
    bits = (exps[:, None] << np.uint32(23) | mants[None, :]).reshape(-1)
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    got = half.from_float32(bits.view(np.float32)).view(np.uint16)
    assert np.array_equal(got, _numpy(bits))


def test_random_bit_patterns_and_shapes():
    bits = np.random.default_rng(1).integers(0, 1 << 32, (1000, 1000), dtype=np.uint64).astype(np.uint32)
    out = np.empty((1000, 1000), np.float16)
    got = half.from_float32(bits.view(np.float32), out)
    assert got is out and got.shape == (1000, 1000)
    assert np.array_equal(got.view(np.uint16), _numpy(bits))


def test_group_steps_of_real_magnitude():
    steps = (np.random.default_rng(2).random(100_000, np.float32) * 0.02).astype(np.float32)
    assert np.array_equal(half.from_float32(steps), steps.astype(np.float16))
