"""The compiled grid recovery (grid_fast) and byte-wise packing equal their torch references exactly."""

from __future__ import annotations

import pytest
import torch

from repack import grid, grid_fast
from repack.packing import pack_int4, pack_int4_reference


def _same(block: torch.Tensor) -> grid.GridResult:
    """Run both implementations; assert every field is identical; return the fast result."""
    fast = grid.recover(block)
    ref = grid.recover_reference(block)
    assert fast.levels.dtype == ref.levels.dtype == torch.int8
    assert torch.equal(fast.levels, ref.levels)
    assert fast.steps.dtype == ref.steps.dtype == torch.float32
    assert torch.equal(fast.steps, ref.steps)
    assert (fast.off_grid, fast.groups) == (ref.off_grid, ref.groups)
    assert fast.max_abs_error == ref.max_abs_error
    assert fast.max_rel_step_error == ref.max_rel_step_error
    assert ref.packed is None and torch.equal(fast.packed, pack_int4_reference(ref.levels))
    return fast


def _levels_times_step(lv: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    return (lv.to(torch.float32) * step).reshape(lv.shape[0] // 8, -1).to(torch.bfloat16)


def test_fast_path_is_taken_for_bf16():
    # The fast kernel must really run: it is what the converters use.
    gen = torch.Generator().manual_seed(0)
    bits = grid.random_on_grid((8, 256), gen).view(torch.int16).numpy().view("uint16").reshape(-1, 32)
    assert grid_fast.recover_bf16(bits) is not None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_on_grid_every_peak_and_zero_groups(seed):
    gen = torch.Generator().manual_seed(seed)
    w = grid.random_on_grid((96, 1024), gen, exponent=-9 - seed)
    r = _same(w)
    assert r.off_grid == 0


@pytest.mark.parametrize(("peak", "sign"), [(p, s) for p in range(1, 9) for s in (1, -1) if (p, s) != (8, 1)])
def test_every_peak_level_without_unit_levels(peak, sign):
    # No level of +-1: the gcd reduction decides the step.
    gen = torch.Generator().manual_seed(peak)
    lv = torch.randint(-peak, min(peak, 7) + 1, (64, 32), generator=gen)
    lv[:, 0] = sign * peak
    lv = torch.where(lv.abs() == 1, torch.zeros_like(lv), lv)
    step = torch.full((64, 1), 7 * 2.0**-11)
    _same(_levels_times_step(lv, step))


def test_bf16_rounded_float32_steps_trigger_least_squares():
    gen = torch.Generator().manual_seed(5)
    lv = torch.randint(-8, 8, (512, 32), generator=gen)
    step = torch.rand((512, 1), generator=gen) * 1e-2 + 1e-4  # not bf16-representable
    r = _same(_levels_times_step(lv, step))
    assert r.max_abs_error > 0 and r.off_grid == 0


def test_off_grid_and_random_data_count_the_same():
    gen = torch.Generator().manual_seed(6)
    w = grid.random_on_grid((32, 512), gen)
    w[::3, 7] = w[::3, 7] + 0.0007
    assert _same(w).off_grid > 0
    noise = (torch.randn((64, 512), generator=gen) * 0.02).to(torch.bfloat16)
    assert _same(noise).off_grid > 0


def test_zero_tiny_and_subnormal_groups():
    w = torch.zeros((4, 128), dtype=torch.bfloat16)
    w[1, 3] = 1e-39  # subnormal in bf16 and float32
    w[2, 40:44] = torch.tensor([3e-39, -2e-39, 1e-40, 5e-39])
    w[3, 100] = 0.5
    _same(w)


def test_non_finite_values_fall_back_to_the_reference():
    w = torch.zeros((2, 64), dtype=torch.bfloat16)
    w[0, 5] = float("nan")
    w[1, 33] = float("inf")
    bits = w.view(torch.int16).numpy().view("uint16").reshape(-1, 32)
    assert grid_fast.recover_bf16(bits) is None
    assert grid.recover(w).off_grid == grid.recover_reference(w).off_grid


def test_block_larger_than_one_kernel_chunk():
    # Several scratch chunks and a partial last one.
    gen = torch.Generator().manual_seed(7)
    w = grid.random_on_grid((1000, 96), gen)
    _same(w)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32])
def test_pack_equals_reference(dtype):
    gen = torch.Generator().manual_seed(8)
    lv = torch.randint(-8, 8, (33, 256), generator=gen).to(dtype)
    assert torch.equal(pack_int4(lv), pack_int4_reference(lv))
    assert torch.equal(pack_int4(lv[:, 64:192]), pack_int4_reference(lv[:, 64:192]))


def test_values_one_ulp_off_the_grid_at_every_peak():
    # The exact test's widest slack: values one bf16 ulp away from level * step. The kernel's
    # one-pass screen of the five candidate steps must never reject a step the exact test takes.
    solved_inexact = 0
    for peak in range(1, 9):
        gen = torch.Generator().manual_seed(100 + peak)
        lv = torch.randint(-peak, min(peak, 7) + 1, (256, 32), generator=gen)
        lv[:, 0] = -peak
        w = (lv.to(torch.float32) * (5 * 2.0**-12)).to(torch.bfloat16)
        bits = w.view(torch.int16)
        nudge = torch.randint(-1, 2, bits.shape, generator=gen, dtype=torch.int16)
        nudge[lv == 0] = 0  # zeros stay zeros
        nudge[:, 0] = 0  # and the peak, which sets the candidate steps
        r = _same((bits + nudge).view(torch.bfloat16))
        solved_inexact += (r.groups - r.off_grid) * (r.max_abs_error > 0)
    assert solved_inexact > 200  # the slack was exercised: many groups fit only within tolerance


def test_a_group_result_does_not_depend_on_its_neighbours():
    # Exact groups (a bf16 step) beside inexact ones (rounded steps, refined by least squares):
    # refinement is per group, so the converters' row chunks of any size give the same result.
    gen = torch.Generator().manual_seed(9)
    lv = torch.randint(-8, 8, (256, 32), generator=gen)
    step = torch.rand((256, 1), generator=gen) * 1e-2 + 1e-4
    step[::2] = 3 * 2.0**-10
    w = _levels_times_step(lv, step)  # [32, 256]: both kinds in every row
    whole = _same(w)
    assert whole.max_abs_error > 0
    rows = [_same(w[i : i + 1]) for i in range(w.shape[0])]
    assert torch.equal(torch.cat([r.steps for r in rows]), whole.steps)
    assert torch.equal(torch.cat([r.levels for r in rows]), whole.levels)
    exact = _same(w.reshape(-1, 32)[::2].reshape(16, 256))  # the exact groups alone
    assert exact.max_abs_error == 0
    assert torch.equal(exact.steps.reshape(-1), whole.steps.reshape(-1)[::2])


def test_candidates_rejected_only_by_values_the_screen_skips():
    # The kernel screens candidate steps on each group's first values only; a candidate that
    # those values allow but a later value rules out must fall to the exact test, then to the
    # next candidate. Here m = 8 and m = 7 pass on the first 16 values (levels 0 and -3 of the
    # true grid) and fail at a later level 1 or 2, so the group ends at m = 6 and a gcd of 2.
    gen = torch.Generator().manual_seed(10)
    lv = torch.randint(0, 2, (128, 32), generator=gen) * -3
    lv[:, 0] = -3
    lv[:, 16:] = torch.randint(-2, 3, (128, 16), generator=gen)
    lv[:, 31] = torch.randint(1, 3, (128,), generator=gen)  # at least one value off m = 8 and 7
    step = torch.full((128, 1), 5 * 2.0**-12)
    r = _same(_levels_times_step(lv, step))
    assert r.off_grid == 0
    assert torch.equal(r.levels.reshape(-1, 32), lv.to(torch.int8))  # the true grid, recovered
