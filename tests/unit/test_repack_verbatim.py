"""NaN and Inf in tensors written as they are (repack.verbatim): the check, and the rule for every tool.

The rule test puts a NaN into each float tensor of the micro checkpoint in turn and runs every
converter: a tensor the converter writes, quantized, copied, renamed or linked, must be refused
with the one-line message; one it drops must not matter.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from repack import finite, verbatim
from repack.st_io import STORAGE
from tests.unit.repack_micro import SHARD, TOWER_SHARD, header, split, write_micro_qat
from tests.unit.test_repack_bad_inputs import CLIP, _clip_bound, run, value_at

TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def _block(dtype: str, values: list[float], cols: int = 4) -> np.ndarray:
    """``values`` (padded with 0.5) as rows of ``cols`` in ``dtype``'s storage."""
    t = torch.full((len(values) // cols + 1, cols), 0.5, dtype=TORCH[dtype])
    t.view(-1)[: len(values)] = torch.tensor(values, dtype=TORCH[dtype])
    return t.view(torch.int16).numpy().view(np.uint16) if dtype == "BF16" else t.numpy().view(STORAGE[dtype])


@pytest.mark.parametrize("dtype", sorted(TORCH))
def test_finite_extremes_pass(dtype: str):
    info = torch.finfo(TORCH[dtype])
    verbatim.check(_block(dtype, [info.max, -info.max, info.tiny / 2, -0.0, 0.0]), dtype)


@pytest.mark.parametrize("dtype", sorted(TORCH))
@pytest.mark.parametrize(
    ("bad", "kind"), [(float("nan"), "NaN"), (float("inf"), "Inf"), (float("-inf"), "Inf")]
)
def test_non_finite_is_refused_with_kind_and_row(dtype: str, bad: float, kind: str):
    values = [1.0] * 13 + [bad]  # the 14th value: row 3 of rows of 4
    with pytest.raises(finite.NonFiniteError) as exc:
        verbatim.check(_block(dtype, values), dtype)
    assert (exc.value.kind, exc.value.row) == (kind, 3)


@pytest.mark.parametrize("dtype", sorted(TORCH))
def test_inf_ok_keeps_inf_but_not_nan(dtype: str):
    verbatim.check(_block(dtype, [float("inf"), float("-inf")]), dtype, inf_ok=True)
    with pytest.raises(finite.NonFiniteError):
        verbatim.check(_block(dtype, [float("inf"), float("nan")]), dtype, inf_ok=True)


def test_only_clip_bounds_may_be_infinite():
    assert verbatim.CLIP_BOUND.search("model.audio_tower.layers.0.feed_forward1.ffw_layer_1.input_max")
    assert verbatim.CLIP_BOUND.search("model.vision_tower.encoder.layers.0.self_attn.q_proj.output_min")
    assert not verbatim.CLIP_BOUND.search("model.language_model.embed_tokens.weight")
    assert not verbatim.CLIP_BOUND.search("model.vision_tower.input_max.weight")


RUNS = [
    ("repack_q4_0.py", "repack", "SRC", "OUT"),
    ("repack_q4_0.py", "build", "SRC", "OUT", "--target", "w4a16"),
    ("repack_q4_0.py", "build", "SRC", "OUT", "--target", "text"),
    ("repack_q4_0.py", "build", "SRC", "OUT", "--target", "emb4"),
    ("repack_q4_0.py", "build", "SRC", "OUT", "--target", "w8a8"),
    ("text_only.py", "SRC", "OUT"),
    ("embed_int4.py", "SRC", "OUT", "--embed-tokens"),
    ("w8a8_from_qat.py", "SRC", "OUT"),
]


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("verbatim") / "micro"
    write_micro_qat(d)
    return d


def _float_tensors(micro: Path) -> list[tuple[str, str]]:
    return [
        (name, shard)
        for shard in (SHARD, TOWER_SHARD)
        for name, info in header(micro / shard).items()
        if name != "__metadata__" and info["dtype"] in TORCH
    ]


def _written(out: Path) -> set[str]:
    names: set[str] = set()
    for f in out.glob("*.safetensors"):
        names |= set(json.loads(split(f)[0])) - {"__metadata__"}
    return names


def _writes(name: str, outs: set[str]) -> bool:
    """True when ``outs`` hold ``name`` (renamed, or as the tensors it was quantized to)."""
    base = name.removesuffix(".weight")
    for b in (base, base.replace("model.language_model.", "model.", 1)):
        if any(o == f"{b}.weight" or o.startswith(f"{b}.weight_") for o in outs):
            return True
    return False


@pytest.mark.parametrize("argv", RUNS, ids=[" ".join(a[:1] + a[4:]) or a[0] for a in RUNS])
def test_every_float_tensor_written_is_checked(argv: tuple[str, ...], micro: Path, tmp_path: Path):
    clean = run(argv, lambda s, t: None, micro, tmp_path / "clean")
    assert clean.code == 0, clean.stderr
    outs = _written(tmp_path / "clean" / "out")
    refused = 0
    for i, (name, shard) in enumerate(_float_tensors(micro)):
        tmp = tmp_path / f"c{i}"
        tmp.mkdir()
        r = run(argv, value_at(float("nan"), name, 0, shard), micro, tmp)
        if _writes(name, outs):
            assert r.code == 2 and f"{name} holds NaN (first in row 0)" in r.line, (name, r.line)
            assert not (tmp / "out").exists()
            refused += 1
        else:  # dropped by this converter (the towers, for the text-only targets)
            assert r.code == 0, (name, r.stderr)
    assert refused >= 10  # the rule was exercised: every linear, table and norm at least


def test_infinite_clip_bound_is_kept(micro: Path, tmp_path: Path):
    """+Inf in a clip bound means "not clipped" (transformers initializes them so): written as is."""
    tmp = tmp_path / "w4"
    tmp.mkdir()
    r = run(("repack_q4_0.py", "repack", "SRC", "OUT"), _clip_bound(float("inf")), micro, tmp)
    assert r.code == 0, r.stderr
    got = load_file(tmp / "out" / TOWER_SHARD)[CLIP]
    assert got.dtype == torch.bfloat16 and torch.isposinf(got).item()
    assert struct.unpack("<H", got.view(torch.int16).numpy().tobytes())[0] == 0x7F80
