"""The W4A16 matmul in plain torch, with the signature vLLM 0.29.0's ``cpu_gemm_wna16`` has."""

from __future__ import annotations

import torch

BLOCK = 16  # output channels per block in the CPU kernel's weight layout
PACK = 8  # 4-bit values per int32

# Each layer's dequantized weight, made at its first call: a layer's weights never change after
# loading, and dequantizing at every call slowed the tiny model several times over (docs/facts.md).
# The entry keeps its tensors, so no address is reused while it is here. Meant for the local
# platform's tiny model: a big one would hold a float copy of each.
_DEQUANTIZED: dict[tuple, tuple[tuple[torch.Tensor, ...], torch.Tensor]] = {}


def unpack_weight(q_weight: torch.Tensor) -> torch.Tensor:
    """The int4 values [K, N] (0..15) of a weight in the layout ``_process_gptq_weights_w4a16``
    leaves: [N / 16, K * 2] int32, each row a block of 16 output channels over every input, the
    nibbles packed along the output dimension."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    blocks, width = q_weight.shape
    words = BLOCK // PACK
    k = width // words
    packed = q_weight.view(blocks, k, words).permute(1, 0, 2).reshape(k, blocks * words)
    return unpack_quantized_values_into_int32(packed, scalar_types.uint4b8, 1)


def gemm_wna16_torch(
    input: torch.Tensor,  # vLLM calls it by this keyword
    q_weight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    bias: torch.Tensor | None,
    pack_factor: int,
    isa_hint: str,
) -> torch.Tensor:
    """``input`` [M, K] times the dequantized weight [K, N], plus ``bias``, in ``input``'s dtype.

    ``scales`` is [groups, N]; ``zeros`` (asymmetric uint4) [groups, N / 8] packed along N, else
    every value is offset by 8 (uint4b8); ``g_idx`` [K] names each input row's group, else rows
    go to groups in order. ``pack_factor`` and ``isa_hint`` steer the C++ kernel only.
    """
    del pack_factor, isa_hint
    sources = tuple(t for t in (q_weight, scales, zeros, g_idx) if t is not None)
    key = tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in sources)
    cached = _DEQUANTIZED.get(key)
    if cached is None:
        cached = _DEQUANTIZED[key] = (sources, dequantize(q_weight, scales, zeros, g_idx))
    out = input.to(torch.float32) @ cached[1]
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(input.dtype)


def dequantize(
    q_weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, g_idx: torch.Tensor | None
) -> torch.Tensor:
    """The float32 weight [K, N] of a layer in the CPU kernel's layout (see gemm_wna16_torch)."""
    q = unpack_weight(q_weight).to(torch.float32)
    k, n = q.shape
    groups = scales.shape[0]
    rows = g_idx.to(torch.long) if g_idx is not None else torch.arange(k) // (k // groups)
    if zeros is not None:
        from vllm.model_executor.layers.quantization.utils.quant_utils import (
            unpack_quantized_values_into_int32,
        )
        from vllm.scalar_type import scalar_types

        zero = unpack_quantized_values_into_int32(zeros, scalar_types.uint4, 1)[:, :n].to(torch.float32)
        q = q - zero.index_select(0, rows)
    else:
        q = q - 8.0
    return q * scales.to(torch.float32).index_select(0, rows)
