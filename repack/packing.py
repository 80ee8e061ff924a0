"""compressed-tensors ``pack-quantized`` int4 packing (symmetric: stored nibble = level + 8)."""

from __future__ import annotations

import torch

PACK = 8  # int4 values per int32 word


def pack_int4(levels: torch.Tensor) -> torch.Tensor:
    """levels [rows, cols] in -8..7 -> int32 [rows, cols/8]; column 8j+i in bits 4i..4i+3 of word j.

    Built with int32 shifts and ORs, never through float32 (words above 2**24 would round).
    """
    rows, cols = levels.shape
    if cols % PACK:
        raise ValueError(f"cannot pack {cols} columns into int32 words of {PACK} nibbles")
    nib = (levels.to(torch.int32) + 8).reshape(rows, cols // PACK, PACK)
    word = nib[..., 0]
    for i in range(1, PACK):
        word = word | (nib[..., i] << (4 * i))
    return word.contiguous()


def unpack_int4(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """int32 [rows, cols/8] -> int8 levels [rows, cols] (the inverse of pack_int4)."""
    shifts = torch.arange(PACK, dtype=torch.int32) * 4
    nib = (packed.unsqueeze(-1) >> shifts) & 0xF
    return (nib.reshape(packed.shape[0], -1)[:, :cols] - 8).to(torch.int8)
