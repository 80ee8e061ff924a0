"""On a real GPU: does the clamped attention launch compute the same attention as vLLM's own?

Not part of the test suite (CI has no GPU); run on a GPU machine with the pure-Python part of
vLLM 0.29.0 on PYTHONPATH (the 35 modules the attention op imports; see evidence/clamp-gpu):

    python tests/clamp/gpu_attention_check.py ATTENTION_FILE > result.json

For Gemma 4's two attention shapes (global: head 512; sliding: head 256, window 512), 8 query
heads and 1 KV head, fp16, a paged KV cache, and a batch mixing prefills and decodes, it runs
vLLM's kernel as shipped and as clamped (the clamp forced by a stand-in capability of 7.5, since
the GPU here is newer), compares both with a float32 reference, times them, and compiles both
launches for sm_75 to report the shared memory a T4 would need.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from module_utils import turing_clamp


class StandInPlatform:
    """vLLM's platform object, reduced to what the attention op asks; capability is ours to set."""

    def __init__(self, capability: tuple[int, int] | None) -> None:
        self.capability = capability

    def get_device_capability(self):
        return self.capability

    def is_device_capability_family(self, family: int) -> bool:
        return False

    def fp8_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn

    def __getattr__(self, name: str):
        if name.startswith("is_"):
            return lambda *args, **kwargs: False
        raise AttributeError(name)


def _seed_platform() -> None:
    """Give vLLM our platform before anything resolves one (no CUDA extension is carried).

    The carried modules have no dist-info, so vLLM's own version lookup is answered too: without
    it, vLLM decides Triton is unusable and swaps in placeholders.
    """
    import importlib.metadata

    lookup = importlib.metadata.version
    importlib.metadata.version = lambda name: "0.29.0" if name == "vllm" else lookup(name)
    import types

    # vLLM resolves its platform while importing; the CUDA platform module needs the compiled
    # extension, so the resolver is handed the stand-in instead.
    fake = types.ModuleType("vllm.platforms.cuda")
    fake.CudaPlatform = lambda: StandInPlatform(None)
    sys.modules["vllm.platforms.cuda"] = fake
    import vllm.platforms as platforms

    platforms._current_platform = StandInPlatform(None)


def _load(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batch(head_size: int, window: int, seed: int = 0):
    """A paged-cache batch: two prefills (one long) and three decodes, Gemma 4 head layout."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    heads, kv_heads, block = 8, 1, 16
    q_lens = [700, 37, 1, 1, 1]
    kv_lens = [700, 37, 900, 65, 2048]
    blocks_per_seq = [math.ceil(n / block) for n in kv_lens]
    max_blocks = max(blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 4
    dev, dt = "cuda", torch.float16
    k_cache = torch.randn(num_blocks, block, kv_heads, head_size, generator=g, device=dev, dtype=dt)
    v_cache = torch.randn(num_blocks, block, kv_heads, head_size, generator=g, device=dev, dtype=dt)
    perm = torch.randperm(num_blocks, generator=g, device=dev).to(torch.int32)
    table = torch.zeros(len(q_lens), max_blocks, dtype=torch.int32, device=dev)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        table[i, :n] = perm[used : used + n]
        used += n
    q = torch.randn(sum(q_lens), heads, head_size, generator=g, device=dev, dtype=dt)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    return {
        "q": q, "k": k_cache, "v": v_cache, "table": table, "cu": cu,
        "q_lens": q_lens, "kv_lens": kv_lens, "window": window, "block": block,
        "seqused": torch.tensor(kv_lens, dtype=torch.int32, device=dev),
    }  # fmt: skip


def _reference(b: dict, scale: float) -> torch.Tensor:
    """Causal (optionally sliding-window) attention in float32, one sequence at a time."""
    out = torch.empty_like(b["q"], dtype=torch.float32)
    block = b["block"]
    for i, (ql, kl) in enumerate(zip(b["q_lens"], b["kv_lens"], strict=True)):
        start = int(b["cu"][i])
        blocks = b["table"][i, : math.ceil(kl / block)].long()
        k = b["k"][blocks].reshape(-1, b["k"].shape[2], b["k"].shape[3])[:kl, 0].float()
        v = b["v"][blocks].reshape(-1, b["v"].shape[2], b["v"].shape[3])[:kl, 0].float()
        q = b["q"][start : start + ql].float()  # [ql, heads, d]
        scores = torch.einsum("qhd,kd->hqk", q, k) * scale
        q_pos = torch.arange(kl - ql, kl, device="cuda")[:, None]
        k_pos = torch.arange(kl, device="cuda")[None, :]
        mask = k_pos <= q_pos
        if b["window"] > 0:
            mask &= k_pos > q_pos - b["window"]
        scores = scores.masked_fill(~mask, float("-inf"))
        out[start : start + ql] = torch.einsum("hqk,kd->qhd", scores.softmax(-1), v)
    return out


def _run(module, b: dict, capability, scale: float, repeats: int = 20) -> tuple[torch.Tensor, float, dict]:
    module.current_platform = StandInPlatform(capability)
    out = torch.empty_like(b["q"])
    launches: dict = {}
    kernel = module.kernel_unified_attention

    class Spy:
        def __getitem__(self, grid):
            def launch(**kwargs):
                launches.update({k: kwargs[k] for k in ("TILE_SIZE", "BLOCK_M") if k in kwargs})
                launches["num_stages"] = kwargs.get("num_stages")
                return kernel[grid](**kwargs)

            return launch

    module.kernel_unified_attention = Spy()
    window = (b["window"] - 1, 0) if b["window"] > 0 else (-1, -1)

    def call():
        module.unified_attention(
            b["q"], b["k"], b["v"], out, cu_seqlens_q=b["cu"], max_seqlen_q=max(b["q_lens"]),
            seqused_k=b["seqused"], max_seqlen_k=max(b["kv_lens"]), softmax_scale=scale, causal=True,
            window_size=window, block_table=b["table"], softcap=0, q_descale=None, k_descale=None,
            v_descale=None,
        )  # fmt: skip

    try:
        call()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            call()
        end.record()
        torch.cuda.synchronize()
    finally:
        module.kernel_unified_attention = kernel
    return out, start.elapsed_time(end) / repeats, launches


def main() -> None:
    attention_file = Path(sys.argv[1])
    _seed_platform()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "clamp-gpu"
    work.mkdir(parents=True, exist_ok=True)
    original_text = attention_file.read_text()
    (work / "original.py").write_text(original_text)
    (work / "clamped.py").write_text(turing_clamp.apply(original_text))
    original = _load(work / "original.py", "attention_original")
    clamped = _load(work / "clamped.py", "attention_clamped")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    import triton

    result["triton"] = triton.__version__
    for name, head_size, window in [("global", 512, 0), ("sliding", 256, 512)]:
        b = _batch(head_size, window)
        scale = 1.0  # Gemma 4 scales queries by a norm, not 1/sqrt(d); any scale tests the kernel
        ref = _reference(b, scale / math.sqrt(head_size))
        for label, module, cap in [("vllm", original, None), ("clamped", clamped, (7, 5))]:
            out, ms, launch = _run(module, b, cap, scale / math.sqrt(head_size))
            err = (out.float() - ref).abs()
            result["cases"].append(
                {
                    "layer": name,
                    "head_size": head_size,
                    "window": window,
                    "kernel": label,
                    "launch": launch,
                    "max_abs_err": err.max().item(),
                    "mean_abs_err": err.mean().item(),
                    "ms_per_call": round(ms, 4),
                }
            )
            print(json.dumps(result["cases"][-1]), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
