"""int4 packing against compressed-tensors' own (un)packing, and the CPU plugin's gather."""

from __future__ import annotations

import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

from repack.packing import pack_int4, unpack_int4


def _levels(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    lv = torch.randint(-8, 8, (rows, cols), generator=gen).to(torch.int8)
    lv[0, :8] = 7  # top nibble 15: the word's sign bit is set
    lv[1, :8] = -8
    return lv


def test_pack_matches_compressed_tensors():
    lv = _levels(64, 256)
    ours = pack_int4(lv)
    assert ours.dtype == torch.int32 and ours.shape == (64, 32)
    assert torch.equal(ours, pack_to_int32(lv, 4))
    assert torch.equal(unpack_from_int32(ours, 4, lv.shape), lv)
    assert torch.equal(unpack_int4(ours, 256), lv)


def test_first_column_sits_in_the_low_nibble():
    lv = torch.full((1, 8), -8, dtype=torch.int8)
    lv[0, 0] = -7  # nibble 1
    lv[0, 7] = 7  # nibble 15 in bits 28..31
    word = int(pack_int4(lv)[0, 0]) & 0xFFFFFFFF
    assert word & 0xF == 1 and word >> 28 == 15


def test_plugin_gather_matches_compressed_tensors_dequantization():
    from vllm_cpu_int4_embedding.gather import dequant_gather_torch

    vocab, hidden = 96, 256
    lv = _levels(vocab, hidden, seed=2)
    scale = (torch.rand(vocab, hidden // 32, generator=torch.Generator().manual_seed(5)) + 0.5).to(
        torch.bfloat16
    )
    packed = pack_to_int32(lv, 4)
    ids = torch.tensor([[0, 1, 95], [7, 7, 42]])
    got = dequant_gather_torch(ids, packed, scale, hidden, 4)
    ref_all = unpack_from_int32(packed, 4, lv.shape).to(torch.float32)
    ref_all = (ref_all.reshape(vocab, -1, 32) * scale.float().unsqueeze(-1)).reshape(vocab, hidden)
    ref = ref_all[ids.reshape(-1)].to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (6, hidden)
    assert torch.equal(got, ref)


def test_plugin_gather_per_channel_scale():
    from vllm_cpu_int4_embedding.gather import dequant_gather_torch

    lv = _levels(16, 64, seed=4)
    scale = torch.linspace(0.5, 2.0, 16).reshape(16, 1).to(torch.float16)
    got = dequant_gather_torch(torch.tensor([3, 15]), pack_to_int32(lv, 4), scale, 64, 4)
    ref = (lv[[3, 15]].float() * scale[[3, 15]].float()).to(torch.float16)
    assert torch.equal(got, ref)


def test_plugin_patches_only_without_triton():
    import vllm_cpu_int4_embedding as plugin
    from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors_embedding as mod
    from vllm.triton_utils import HAS_TRITON

    applied = plugin.register()
    assert applied == (not HAS_TRITON)
    assert (mod._dequant_gather_triton is plugin.dequant_gather_torch) == (not HAS_TRITON)
