"""vLLM general plugin: a plain-torch int4 embedding gather where Triton has no backend."""

from __future__ import annotations

import logging

from vllm_cpu_int4_embedding.gather import dequant_gather_torch

__all__ = ["dequant_gather_torch", "register"]
__version__ = "1.0.0"

TARGET = "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_embedding"
log = logging.getLogger(__name__)


def register() -> bool:
    """Entry point (``vllm.general_plugins``): patch the gather when Triton is unusable.

    Returns True when the patch was applied, False when Triton works and vLLM's kernel stays.
    """
    import importlib

    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return False
    mod = importlib.import_module(TARGET)
    if getattr(mod, "_dequant_gather_triton", None) is dequant_gather_torch:
        return True
    if not hasattr(mod, "_dequant_gather_triton"):
        # A vLLM without this function is not the one this plugin was written for: leave it alone.
        log.warning("vllm_cpu_int4_embedding: %s has no _dequant_gather_triton; not patching", TARGET)
        return False
    mod._dequant_gather_triton = dequant_gather_torch
    log.info("vllm_cpu_int4_embedding: Triton unavailable, int4 embeddings use the torch gather")
    return True
