"""vLLM general plugin: a plain-torch W4A16 matmul where the CPU kernel library has none."""

from __future__ import annotations

import logging
from typing import Any

from vllm_cpu_wna16.gemm import gemm_wna16_torch

__all__ = ["gemm_wna16_torch", "register"]
__version__ = "1.0.0"

TARGET = "vllm._custom_ops"
log = logging.getLogger(__name__)


def kernel_missing() -> bool:
    """Whether the kernel library vLLM loaded registers no ``cpu_gemm_wna16`` (AVX2-only x86)."""
    import torch

    try:
        torch.ops._C.cpu_gemm_wna16  # noqa: B018  # the lookup is the question
    except (AttributeError, RuntimeError):
        return True
    return False


def register() -> bool:
    """Entry point (``vllm.general_plugins``): route ``cpu_gemm_wna16`` to plain torch when the
    kernel is missing. The libraries load after the plugins in some processes, so the choice is
    made at the first call, then kept. Returns True when the wrapper is in place."""
    import importlib

    mod = importlib.import_module(TARGET)
    kernel = getattr(mod, "cpu_gemm_wna16", None)
    if kernel is None:
        # A vLLM without this function is not the one this plugin was written for: leave it alone.
        log.warning("vllm_cpu_wna16: %s has no cpu_gemm_wna16; not patching", TARGET)
        return False
    if getattr(kernel, "_gemma_rig_wna16", False):
        return True
    chosen: list[Any] = []

    def cpu_gemm_wna16(*args: Any, **kwargs: Any) -> Any:
        if not chosen:
            chosen.append(gemm_wna16_torch if kernel_missing() else kernel)
            if chosen[0] is gemm_wna16_torch:
                log.warning(
                    "vllm_cpu_wna16: no cpu_gemm_wna16 kernel here (AVX2?): W4A16 runs in plain torch"
                )
        return chosen[0](*args, **kwargs)

    cpu_gemm_wna16._gemma_rig_wna16 = True  # type: ignore[attr-defined]
    mod.cpu_gemm_wna16 = cpu_gemm_wna16
    return True
