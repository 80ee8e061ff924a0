"""The int4 (2-8 bit) embedding gather in plain torch, with the signature vLLM 0.29.0 calls."""

from __future__ import annotations

import torch


def dequant_gather_torch(
    ids: torch.Tensor,
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    hidden: int,
    num_bits: int,
) -> torch.Tensor:
    """Rows ``ids`` of a packed table, dequantized to ``weight_scale.dtype``: [n, hidden].

    ``weight_packed`` is int32 [vocab, hidden * num_bits / 32] with column ``k*j + i`` in bits
    ``num_bits*i ..`` of word ``j`` (k = 32 / num_bits); values are symmetric, offset by
    ``2**(num_bits-1)``. ``weight_scale`` is [vocab, groups] (groups == 1: per channel).
    """
    ids = ids.reshape(-1).to(torch.long)
    n = ids.numel()
    pack = 32 // num_bits
    rows = weight_packed.index_select(0, ids)
    shifts = torch.arange(pack, device=rows.device, dtype=torch.int32) * num_bits
    # An arithmetic shift of a negative word drags sign bits in; the mask drops them.
    q = (rows.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)
    q = q.reshape(n, -1)[:, :hidden].to(torch.float32) - float(1 << (num_bits - 1))
    scales = weight_scale.index_select(0, ids).to(torch.float32)
    groups = scales.shape[1]
    if groups == 1:
        out = q * scales
    else:
        out = (q.reshape(n, groups, hidden // groups) * scales.unsqueeze(-1)).reshape(n, hidden)
    return out.to(weight_scale.dtype)
