"""The local platform's W8A8 matmul for CPUs whose oneDNN int8 kernel saturates (x86 without VNNI).

The reference is the plain definition of W8A8: (int8 activation minus its zero point) times its
scale, times (int8 weight times its channel's scale). vLLM's own quantizer makes the activations,
and the patched ``vllm._custom_ops`` functions are called the way vLLM's CPU int8 kernel calls
them, so a wrong kernel choice shows here on any machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

vllm_cpu_int8 = pytest.importorskip("vllm_cpu_int8")


def has_vnni() -> bool:
    """Whether this x86 processor multiplies int8 with 32-bit sums (VNNI), as /proc/cpuinfo says."""
    flags = Path("/proc/cpuinfo").read_text()
    return re.search(r"\b(avx512_vnni|avx_vnni|amx_int8)\b", flags) is not None


def definition(x_q, x_s, x_zp, w_q, w_s, bias=None) -> torch.Tensor:
    """W8A8 as written down: x_q [M, K], w_q [N, K] int8, scales per token and per channel."""
    x = (x_q.double() - (x_zp.double() if x_zp is not None else 0)) * x_s.double()
    out = x @ (w_q.double() * w_s.double().reshape(-1, 1)).t()
    return out + bias.double() if bias is not None else out


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("per_channel", [True, False])
def test_the_torch_matmul_is_w8a8(symmetric: bool, per_channel: bool) -> None:
    torch.manual_seed(0)
    m, k, n = 5, 192, 48
    w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    w_s = torch.rand(n, 1) * 0.01 + 0.001 if per_channel else torch.tensor([0.004])
    x_q = torch.randint(-128 if not symmetric else -127, 128, (m, k), dtype=torch.int8)
    x_s = torch.rand(m, 1) * 0.05 + 0.01
    x_zp = None if symmetric else torch.randint(-20, 20, (m, 1), dtype=torch.int32)
    bias = torch.randn(n).to(torch.bfloat16)
    handler = vllm_cpu_int8.create_torch_int8_mm(w_q.t(), w_s, torch.bfloat16, True, not symmetric)
    assert (handler.k, handler.n) == (k, n)
    out = torch.empty((m, n), dtype=torch.bfloat16)
    got = vllm_cpu_int8.torch_int8_mm(handler, x_q, out, x_s, x_zp, None, bias)
    assert got is out
    want = definition(x_q, x_s, x_zp, w_q, w_s, bias)
    assert (got.double() - want).abs().max() <= 1e-2 * want.abs().max()
    # Each weight is where it belongs: one moved value moves one output column only.
    w_q2 = w_q.clone()
    w_q2[7, 3] = -w_q2[7, 3] if w_q2[7, 3] else 100
    handler2 = vllm_cpu_int8.create_torch_int8_mm(w_q2.t(), w_s, torch.bfloat16, True, not symmetric)
    moved = vllm_cpu_int8.torch_int8_mm(handler2, x_q, torch.empty_like(out), x_s, x_zp, None, bias)
    changed = (moved.float() - got.float()).abs().amax(dim=0) > 0
    assert changed.nonzero().flatten().tolist() == [7]


@pytest.mark.parametrize("default_dtype", [torch.float32, torch.bfloat16])
def test_the_probe_finds_the_kernel_wrong_exactly_where_it_saturates(default_dtype: torch.dtype) -> None:
    """The real oneDNN kernel of this machine, asked the probe: wrong without VNNI, right with it;
    also with bf16 as torch's default dtype, as vLLM sets it while it loads a bf16 model."""
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    before = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype)
    try:
        probe_the_kernel(ops)
    finally:
        torch.set_default_dtype(before)


def probe_the_kernel(ops) -> None:
    # vLLM's own functions, whether or not register() has wrapped them in this process.
    create = getattr(ops.create_onednn_scaled_mm, "kernel", ops.create_onednn_scaled_mm)
    mm = getattr(ops.onednn_scaled_mm, "kernel", ops.onednn_scaled_mm)
    assert vllm_cpu_int8.kernel_sums_wrong(create, mm) == (not has_vnni())
    # A kernel that sums right passes the probe: the plugin's own matmul.
    assert (
        vllm_cpu_int8.kernel_sums_wrong(vllm_cpu_int8.create_torch_int8_mm, vllm_cpu_int8.torch_int8_mm)
        is False
    )


@pytest.mark.parametrize("symmetric", [True, False])
def test_vllm_multiplies_right_after_register(symmetric: bool) -> None:
    """After register(), vLLM's ops answer W8A8 right here, called as its CPU int8 kernel calls
    them (weight [K, N] transposed, bf16 out, vLLM's own per-token quantizer): through oneDNN where
    it sums right, through the plugin where it does not. Without the plugin an AVX2-only host is
    off by a fifth of the largest output."""
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    assert vllm_cpu_int8.register() is True
    assert vllm_cpu_int8.register() is True  # twice: still one wrapper
    torch.manual_seed(1)
    m, k, n = 4, 256, 512
    w_q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    w_s = torch.rand(n, 1) * 0.01
    x = (torch.randn(m, k) * 3).to(torch.bfloat16)
    handler = ops.create_onednn_scaled_mm(w_q.t(), w_s, torch.bfloat16, True, not symmetric, 32)
    assert isinstance(handler, vllm_cpu_int8.TorchInt8Handler) == (not has_vnni())
    x_q, x_s, x_zp = ops.onednn_scaled_int8_quant(x, None, None, symmetric)
    adj = None if symmetric else w_q.t().sum(dim=0, keepdim=True, dtype=torch.float32) * w_s.squeeze()
    out = torch.empty((m, n), dtype=torch.bfloat16)
    ops.onednn_scaled_mm(handler, x_q, out, x_s, x_zp, adj, None)
    want = definition(x_q, x_s, x_zp, w_q, w_s)
    assert (out.double() - want).abs().max() <= 1e-2 * want.abs().max()
