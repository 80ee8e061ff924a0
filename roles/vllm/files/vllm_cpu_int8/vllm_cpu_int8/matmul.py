"""The W8A8 int8 matmul in plain torch, with the interface vLLM 0.29.0's oneDNN one has."""

from __future__ import annotations

import torch


class TorchInt8Handler:
    """What ``create_onednn_scaled_mm`` returns on this path: the layer's weight, already
    multiplied by its scales, as float32 [K, N]. vLLM reads ``n`` (and ``k``) from it.

    The float copy costs four times the int8 weight: right for the local platform's tiny model,
    wrong for a big one."""

    def __init__(self, weight: torch.Tensor, weight_scales: torch.Tensor, output_type: torch.dtype) -> None:
        self.k, self.n = weight.size()
        self.output_type = output_type
        scales = weight_scales.to(torch.float32).reshape(-1)  # one per output channel, or one for all
        self.weight = weight.to(torch.float32) * scales


def create_torch_int8_mm(
    weight: torch.Tensor,  # [K, N] int8
    weight_scales: torch.Tensor,
    output_type: torch.dtype,
    dynamic_quant: bool,
    use_azp: bool,
    primitive_cache_size: int = 128,
) -> TorchInt8Handler:
    """``create_onednn_scaled_mm``'s signature; the quantization kind is read at each call."""
    del dynamic_quant, use_azp, primitive_cache_size
    return TorchInt8Handler(weight, weight_scales, output_type)


def torch_int8_mm(
    handler: TorchInt8Handler,
    x: torch.Tensor,  # [M, K] int8
    output: torch.Tensor,  # [M, N], written
    input_scale: torch.Tensor | None,
    input_zp: torch.Tensor | None,
    input_zp_adj: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``output = input_scale * ((x - input_zp) @ weight) + bias``: the definition of W8A8 that
    oneDNN's ``s_a * GEMM - s_a * zp_a * adj + bias`` computes (``input_zp_adj`` is the column sums
    of the scaled weight, which subtracting the zero point first makes unneeded). The scale and zero
    point are per token [M, 1] (dynamic) or one for all (static)."""
    del input_zp_adj
    values = x.to(torch.float32)
    if input_zp is not None:
        values = values - input_zp.to(torch.float32)
    out = values @ handler.weight
    if input_scale is not None:
        out = out * input_scale.to(torch.float32)
    if bias is not None:
        out = out + bias.to(torch.float32)
    output.copy_(out.to(output.dtype))
    return output
