"""Read every tensor of a checkpoint directory (all its *.safetensors files) for comparisons."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open


def tensors(d: Path) -> dict[str, torch.Tensor]:
    """Name -> tensor over the directory's shards, in file-name order."""
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():  # noqa: SIM118 - safe_open handles are not iterable
                out[k] = h.get_tensor(k)
    return out
