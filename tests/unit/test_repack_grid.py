"""Grid recovery: every peak level, negative peaks, zero groups, single values, the amax/8 trap, bf16."""

from __future__ import annotations

import pytest
import torch

from repack import grid


def _group(levels: list[int], step: float) -> torch.Tensor:
    lv = torch.tensor(levels + [0] * (32 - len(levels)), dtype=torch.float32)
    return (lv * step).to(torch.bfloat16).reshape(1, 32)


# +8 is not a Q4_0 level, so a positive peak goes up to 7 and only a negative one reaches 8.
@pytest.mark.parametrize(("peak", "sign"), [(p, s) for p in range(1, 9) for s in (1, -1) if (p, s) != (8, 1)])
def test_every_peak_level_is_recovered_exactly(peak, sign):
    step = 11 * 2.0**-9
    # peak, then 1 (so the levels share no factor), then a spread below the peak
    levels = [sign * peak, 1, -1, 0] + [((i * 5) % (2 * peak + 1)) - peak for i in range(20)]
    levels = [min(v, 7) for v in levels]
    w = _group(levels, step)
    r = grid.recover(w)
    assert r.off_grid == 0
    assert r.levels.flatten()[:24].tolist() == levels
    assert r.steps.item() == step
    assert torch.equal(grid.dequantize(r.levels, r.steps).to(torch.bfloat16), w)


def test_negative_full_peak_uses_level_minus_eight():
    w = _group([-8, 7, 3, -2], 2.0**-6)
    r = grid.recover(w)
    assert r.off_grid == 0 and r.levels.flatten()[0] == -8 and r.steps.item() == 2.0**-6


def test_zero_group_is_on_grid_with_zero_levels():
    r = grid.recover(torch.zeros(2, 64, dtype=torch.bfloat16))
    assert r.off_grid == 0 and r.groups == 4
    assert not r.levels.any() and not r.steps.any()


@pytest.mark.parametrize("value", [0.5, -0.375, 3.0e-3])
def test_single_nonzero_value(value):
    w = torch.zeros(1, 32, dtype=torch.bfloat16)
    w[0, 17] = value
    r = grid.recover(w)
    assert r.off_grid == 0
    assert torch.equal(grid.dequantize(r.levels, r.steps).to(torch.bfloat16), w)
    assert abs(int(r.levels[0, 17])) == 1  # the coarsest grid: one step of |value|


def test_amax_over_8_trap_is_avoided():
    step = 13 * 2.0**-10
    levels = [5, -4, 3, -3, 2, 1, 0, -1, 4, -5]
    w = _group(levels, step)
    # What a naive amax/8 quantizer does: a different, finer grid, and the values move.
    naive = w.float().abs().max() / 8
    requant = (torch.round(w.float() / naive).clamp(-8, 7) * naive).to(torch.bfloat16)
    assert not torch.equal(requant, w)
    r = grid.recover(w)
    assert r.off_grid == 0 and r.steps.item() == step
    assert torch.equal(grid.dequantize(r.levels, r.steps).to(torch.bfloat16), w)


def test_bf16_rounded_values_of_a_float32_step_stay_on_grid():
    gen = torch.Generator().manual_seed(3)
    step = torch.tensor(0.0123456789, dtype=torch.float32)  # not representable in bf16
    lv = torch.randint(-8, 8, (64, 32), generator=gen).to(torch.float32)
    lv[:, 0] = -8
    w = (lv * step).to(torch.bfloat16)
    r = grid.recover(w)
    assert r.off_grid == 0
    assert torch.equal(r.levels.to(torch.float32), lv)
    deq = grid.dequantize(r.levels, r.steps)
    ulp = w.float().abs() * 2.0**-7
    assert bool(((deq - w.float()).abs() <= ulp + 1e-12).all())
    assert (deq.to(torch.bfloat16) == w).float().mean() > 0.9


def test_off_grid_groups_are_counted():
    gen = torch.Generator().manual_seed(0)
    w = grid.random_on_grid((4, 128), gen)
    w[1, 40] = w[1, 40] + 0.0007  # one group knocked off its grid
    r = grid.recover(w)
    assert r.groups == 16 and r.off_grid == 1


def test_random_on_grid_covers_every_peak_and_round_trips():
    gen = torch.Generator().manual_seed(1)
    w = grid.random_on_grid((64, 512), gen)
    r = grid.recover(w)
    assert r.off_grid == 0
    assert torch.equal(grid.dequantize(r.levels, r.steps).to(torch.bfloat16), w)


@pytest.mark.parametrize("shape", [(64, 48), (64,), (2, 3, 32)])
def test_wrong_shape_for_group_size_names_the_tensor(shape):
    with pytest.raises(grid.GridShapeError, match=r"layers\.0\.mlp"):
        grid.check_group_shape("model.layers.0.mlp.up_proj.weight", shape)
