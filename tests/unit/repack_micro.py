"""A micro Gemma 4 in the QAT layout, and raw edits of safetensors files, for the bad-input tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors.torch import save_file

from repack import grid

SHARD = "model-00001-of-00002.safetensors"
TOWER_SHARD = "model-00002-of-00002.safetensors"
LM = "model.language_model."
Q = f"{LM}layers.0.self_attn.q_proj.weight"  # a linear every target quantizes
TOWER = "model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"


def write_micro_qat(out: Path) -> None:
    """A few-tensor multimodal Gemma 4 in the QAT layout: enough for every converter, built in milliseconds."""
    out.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    lm = {
        f"{LM}{n}": grid.random_on_grid((64, 128), gen)
        for n in ("embed_tokens.weight", "embed_tokens_per_layer.weight")
    }
    for i in range(2):
        for p in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj", "mlp.up_proj"):
            lm[f"{LM}layers.{i}.{p}.weight"] = grid.random_on_grid((64, 128), gen)
        lm[f"{LM}layers.{i}.self_attn.q_norm.weight"] = torch.ones(32, dtype=torch.bfloat16)
    lm[f"{LM}layers.0.self_attn.k_norm.weight"] = torch.ones(32, dtype=torch.bfloat16)
    towers = {TOWER: torch.randn(64, 48, generator=gen).to(torch.bfloat16)}
    save_file(lm, out / SHARD, metadata={"format": "pt"})
    save_file(towers, out / TOWER_SHARD, metadata={"format": "pt"})
    wm = {**dict.fromkeys(lm, SHARD), **dict.fromkeys(towers, TOWER_SHARD)}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    tc = {
        "model_type": "gemma4_text",
        "num_hidden_layers": 2,
        "num_kv_shared_layers": 1,
        "tie_word_embeddings": True,
    }
    cfg = {"model_type": "gemma4", "text_config": tc, "vision_config": {"model_type": "gemma4_vision"}}
    (out / "config.json").write_text(json.dumps(cfg))


def split(path: Path) -> tuple[bytes, bytes]:
    """(header JSON bytes, data section) of a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8 : 8 + n], raw[8 + n :]


def header(path: Path) -> dict:
    return json.loads(split(path)[0])


def put(path: Path, head: dict | str | bytes, data: bytes | None = None) -> None:
    """Write ``path`` with a new header (an object, or raw text for what JSON objects cannot say)
    and its data section (by default the one it had)."""
    if data is None:
        data = split(path)[1]
    raw = head if isinstance(head, bytes) else (head if isinstance(head, str) else json.dumps(head)).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def edit_entry(path: Path, name: str, **changes: object) -> None:
    """Change fields of one tensor's header entry, data untouched."""
    h = header(path)
    h[name].update(changes)
    put(path, h)


def set_value(path: Path, name: str, row: int, col: int, value: float) -> None:
    """Overwrite one value of a tensor in place (its bytes, in the tensor's dtype)."""
    h = header(path)
    info = h[name]
    dt = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}[info["dtype"]]
    size = torch.tensor([], dtype=dt).element_size()
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    start = 8 + n + info["data_offsets"][0] + (row * info["shape"][1] + col) * size
    b = torch.tensor([value], dtype=dt).view(torch.uint8).numpy().tobytes()
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b)
