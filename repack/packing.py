"""compressed-tensors ``pack-quantized`` int4 packing (symmetric: stored nibble = level + 8)."""

from __future__ import annotations

import sys

import torch

PACK = 8  # int4 values per int32 word


def pack_int4(levels: torch.Tensor) -> torch.Tensor:
    """levels [rows, cols] in -8..7 -> int32 [rows, cols/8]; column 8j+i in bits 4i..4i+3 of word j.

    Built with integer shifts and ORs, never through float32 (words above 2**24 would round).
    On a little-endian host the word is its four bytes in order, so two nibbles per byte and an
    int32 view of the bytes give the same words in three byte-wide passes.
    """
    _rows, cols = levels.shape
    if cols % PACK:
        raise ValueError(f"cannot pack {cols} columns into int32 words of {PACK} nibbles")
    if sys.byteorder == "little" and levels.dtype == torch.int8:
        nib = (levels + 8).view(torch.uint8)
        return (nib[:, 0::2] | (nib[:, 1::2] << 4)).contiguous().view(torch.int32)
    return pack_int4_reference(levels)


def pack_int4_reference(levels: torch.Tensor) -> torch.Tensor:
    """pack_int4 with int32 shifts, word by word (any integer dtype, any byte order)."""
    rows, cols = levels.shape
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
