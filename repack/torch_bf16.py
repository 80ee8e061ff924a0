"""Tensors between the converters' form and torch's: numpy arrays in safetensors' storage dtype
(bf16 as its bits, uint16) on one side, torch tensors (bf16 as torch.bfloat16) on the other.

Only the torch references and the tests cross over; torch is imported when they do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def to_torch(array: np.ndarray, dtype: str) -> torch.Tensor:
    """A numpy array in ``dtype``'s storage as a torch tensor of that dtype (shares memory)."""
    import torch

    array = np.ascontiguousarray(array)
    if dtype == "BF16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def bits(tensor: torch.Tensor) -> np.ndarray:
    """A bf16 tensor as the uint16 array of its bits (the converters' BF16 storage)."""
    import torch

    return tensor.contiguous().view(torch.int16).numpy().view(np.uint16)
