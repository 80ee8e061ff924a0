"""vLLM general plugin: a plain-torch W8A8 matmul where the CPU's oneDNN int8 kernel sums wrong."""

from __future__ import annotations

import logging
from typing import Any

from vllm_cpu_int8.matmul import TorchInt8Handler, create_torch_int8_mm, torch_int8_mm

__all__ = ["TorchInt8Handler", "create_torch_int8_mm", "kernel_sums_wrong", "register", "torch_int8_mm"]
__version__ = "1.0.0"

TARGET = "vllm._custom_ops"
log = logging.getLogger(__name__)

# The probe: every weight and every activation at the int8 maximum, so that each pair of products
# overflows a 16-bit sum. x86 without VNNI multiplies int8 with vpmaddubsw, which saturates there;
# a kernel that sums in 32 bits gets PROBE_K * 127 * 127 (to bf16's precision).
PROBE_K, PROBE_N = 64, 16


def kernel_sums_wrong(create: Any, mm: Any) -> bool:
    """Whether vLLM's oneDNN W8A8 matmul (``create`` and ``mm``, as ``vllm._custom_ops`` has them)
    misses the exact answer of a worst-case product on this processor."""
    import torch

    weight = torch.full((PROBE_N, PROBE_K), 127, dtype=torch.int8).t()  # [K, N], as vLLM hands it
    # The handler keeps pointers to the weight and the scales: both must outlive the call. Every
    # dtype is spelled out: vLLM loads the model with its dtype (bf16) as torch's default.
    scales = torch.ones(PROBE_N, dtype=torch.float32)
    handler = create(weight, scales, torch.bfloat16, True, False, 32)
    x = torch.full((1, PROBE_K), 127, dtype=torch.int8)
    out = torch.zeros((1, PROBE_N), dtype=torch.bfloat16)
    mm(handler, x, out, torch.ones((1, 1), dtype=torch.float32), None, None, None)
    exact = torch.full((1, PROBE_N), PROBE_K * 127 * 127, dtype=torch.float32)
    del weight, scales, handler
    return not torch.allclose(out.to(torch.float32), exact, rtol=1e-2, atol=0)


def register() -> bool:
    """Entry point (``vllm.general_plugins``): route vLLM's oneDNN W8A8 matmul to plain torch when
    the probe finds its sums wrong. The kernel libraries load after the plugins in some processes,
    so the probe runs at the first layer's preparation, and its answer is kept. Returns True when
    the wrappers are in place."""
    import importlib

    mod = importlib.import_module(TARGET)
    create = getattr(mod, "create_onednn_scaled_mm", None)
    mm = getattr(mod, "onednn_scaled_mm", None)
    if create is None or mm is None:
        # A vLLM without these is not the one this plugin was written for: leave it alone.
        log.warning("vllm_cpu_int8: %s has no oneDNN scaled matmul; not patching", TARGET)
        return False
    if getattr(create, "_gemma_rig_int8", False):
        return True
    wrong: list[bool] = []

    def create_onednn_scaled_mm(*args: Any, **kwargs: Any) -> Any:
        if not wrong:
            wrong.append(kernel_sums_wrong(create, mm))
            if wrong[0]:
                log.warning(
                    "vllm_cpu_int8: the oneDNN int8 matmul saturates here (no VNNI?): W8A8 runs in plain torch"
                )
        return (create_torch_int8_mm if wrong[0] else create)(*args, **kwargs)

    def onednn_scaled_mm(handler: Any, *args: Any, **kwargs: Any) -> Any:
        return (torch_int8_mm if isinstance(handler, TorchInt8Handler) else mm)(handler, *args, **kwargs)

    create_onednn_scaled_mm._gemma_rig_int8 = True  # type: ignore[attr-defined]
    # vLLM's own functions stay reachable, for asking the probe again.
    create_onednn_scaled_mm.kernel = create  # type: ignore[attr-defined]
    onednn_scaled_mm.kernel = mm  # type: ignore[attr-defined]
    mod.create_onednn_scaled_mm = create_onednn_scaled_mm
    mod.onednn_scaled_mm = onednn_scaled_mm
    return True
