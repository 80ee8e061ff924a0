"""The W8A8 build as its card describes it: bf16 scales [out, 1], and the int8 values' relative
error against the QAT values (per tensor, and min / mean / max) in the summary and repack.json.

The card (xbill9/gemma-4-E2B-it-qat-w8a8-int8) reports 0.6-1.7% per tensor, mean about 0.8%.
The synthetic tensors here stand in for the QAT release: Gaussian rows of varied scale, snapped
per group of 32 to a 4-bit grid (levels -8..7, step amax / 8 with four significant bits, so every
value is exact in bf16), at the input widths of Gemma 4 E2B's linears.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from repack import int8_error, int8_fast, pipeline, repack_q4_0, w8a8_from_qat
from tests.unit.repack_micro import LM, SHARD, header, write_micro_qat

# (rows, input width): E2B's linears read 1536 (q/k/v, gate/up), 2048 (o_proj), 256
# (per_layer_projection), 6144 and 12288 (down_proj); fewer rows keep the test fast (a
# tensor's figure depends on the width through each row's peak, hardly on the row count).
SHAPES = {
    "layers.0.self_attn.q_proj": (128, 1536),
    "layers.0.self_attn.o_proj": (96, 2048),
    "layers.0.mlp.up_proj": (160, 1536),
    "layers.0.mlp.down_proj": (48, 6144),
    "layers.1.self_attn.q_proj": (128, 1536),
    "layers.1.self_attn.o_proj": (256, 256),
    "layers.1.mlp.up_proj": (160, 1536),
    "layers.1.mlp.down_proj": (24, 12288),
}
CARD_RANGE = (0.6, 1.7)  # percent, per tensor


def qat_like(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """A bf16 tensor as the QAT release stores one: on a 4-bit grid per group of 32."""
    w = (
        torch.randn((rows, cols), generator=gen)
        * 0.02
        * torch.exp(0.3 * torch.randn((rows, 1), generator=gen))
    )
    g = w.reshape(rows, cols // 32, 32)
    step = g.abs().amax(-1, keepdim=True) / 8
    e = torch.floor(torch.log2(step))
    step = torch.round(step / 2**e * 8) / 8 * 2**e  # four significant bits
    return (torch.clamp(torch.round(g / step), -8, 7) * step).reshape(rows, cols).to(torch.bfloat16)


@pytest.fixture(scope="module")
def qat(tmp_path_factory) -> Path:
    """The micro QAT checkpoint with its eight linears replaced by QAT-like ones."""
    out = tmp_path_factory.mktemp("card") / "qat"
    write_micro_qat(out)
    gen = torch.Generator().manual_seed(15)
    lm = load_file(out / SHARD)
    for name, shape in SHAPES.items():
        lm[f"{LM}{name}.weight"] = qat_like(*shape, gen)
    save_file(lm, out / SHARD, metadata={"format": "pt"})
    return out


def _convert(src: Path, out: Path, capsys, *extra: str) -> str:
    assert w8a8_from_qat.main([str(src), str(out), "-q", *extra]) == 0
    return capsys.readouterr().out


def test_relative_error_of_qat_like_tensors_is_in_the_cards_range():
    gen = torch.Generator().manual_seed(0)
    got = {}
    for name, shape in SHAPES.items():
        r = int8_fast.quantize(qat_like(*shape, gen))
        got[name] = int8_error.percent(r.err_sq, r.ref_sq)
    print({k: round(v, 4) for k, v in got.items()})
    assert all(CARD_RANGE[0] <= v <= CARD_RANGE[1] for v in got.values()), got
    assert 0.65 <= sum(got.values()) / len(got) <= 0.95  # the card: mean about 0.8%


def test_relative_error_definition_on_values_worked_by_hand():
    # One row [3, -1, 0.5, 0]: step 3 / 127 -> bf16 0.023681640625 (194 * 2**-13); levels 127,
    # -42, 21, 0; errors 127s - 3, -42s + 1, 21s - 0.5, 0.
    w = torch.tensor([[3.0, -1.0, 0.5, 0.0]], dtype=torch.bfloat16)
    r = int8_fast.quantize(w)
    s = 194 * 2.0**-13
    assert r.scale.float().item() == s and r.q.tolist() == [[127, -42, 21, 0]]
    err = [127 * s - 3, -42 * s + 1, 21 * s - 0.5]
    want = 100 * math.sqrt(sum(e * e for e in err) / (9 + 1 + 0.25))
    assert int8_error.percent(r.err_sq, r.ref_sq) == pytest.approx(want, rel=1e-6)
    assert int8_error.percent(0.0, 0.0) == 0.0  # an all-zero tensor


def test_summarize_min_mean_max():
    s = int8_error.summarize({"a": 0.6, "b": 1.7, "c": 0.1 + 0.2})
    assert (s["min_percent"], s["max_percent"], s["min_tensor"], s["max_tensor"]) == (0.3, 1.7, "c", "b")
    assert s["mean_percent"] == round((0.6 + 1.7 + 0.3) / 3, 4) and s["tensors"] == 3
    assert int8_error.summarize({}) is None


def test_scales_are_bf16_out_by_1_in_the_written_header(qat, tmp_path, capsys):
    out = tmp_path / "w8a8"
    _convert(qat, out, capsys)
    heads = {
        k: v for f in sorted(out.glob("*.safetensors")) for k, v in header(f).items() if k != "__metadata__"
    }
    scales = {k: v for k, v in heads.items() if k.endswith(".weight_scale")}
    assert len(scales) == len(SHAPES)
    for name, entry in scales.items():
        rows, _ = heads[name.replace("_scale", "")]["shape"]
        assert entry["dtype"] == "BF16" and entry["shape"] == [rows, 1], (name, entry)
        assert heads[name.replace("_scale", "")]["dtype"] == "I8"
    assert not [k for k, v in heads.items() if v["dtype"] == "F32"]  # no float32 left anywhere


def test_summary_and_stamp_carry_the_relative_error(qat, tmp_path, capsys):
    out = tmp_path / "w8a8"
    line = _convert(qat, out, capsys)
    rel = json.loads((out / "repack.json").read_text())["summary"]["int8_relative_error"]
    per = rel["per_tensor_percent"]
    assert sorted(per) == sorted(f"{LM}{n}.weight" for n in SHAPES)  # source names
    assert rel["tensors"] == len(SHAPES) and "||w||" in rel["definition"]
    assert rel["min_percent"] == min(per.values()) and rel["max_percent"] == max(per.values())
    assert rel["mean_percent"] == pytest.approx(sum(per.values()) / len(per), abs=1e-4)
    assert CARD_RANGE[0] <= rel["min_percent"] <= rel["mean_percent"] <= rel["max_percent"] <= CARD_RANGE[1]
    m = re.search(r"relative error .* min ([\d.]+)%, mean ([\d.]+)%, max ([\d.]+)% over (\d+) tensors", line)
    assert m, line
    assert [float(m.group(i)) for i in (1, 2, 3)] == [
        round(rel[k], 2) for k in ("min_percent", "mean_percent", "max_percent")
    ]
    assert int(m.group(4)) == len(SHAPES)
    # The figures from the written checkpoint itself: int8 times the stored bf16 scale, in float64.
    src = load_file(qat / SHARD)
    with safe_open(str(out / "model.safetensors"), "pt") as h:
        for name, shape in SHAPES.items():
            w = src[f"{LM}{name}.weight"].double()
            dq = (
                h.get_tensor(f"model.{name}.weight").double()
                * h.get_tensor(f"model.{name}.weight_scale").double()
            )
            assert dq.shape == shape
            want = 100 * ((dq - w).norm() / w.norm()).item()
            assert per[f"{LM}{name}.weight"] == pytest.approx(want, abs=1e-4)


def _digests(d: Path) -> dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(d.iterdir())
        if f.name != "repack.json"
    }


def test_a_second_run_writes_the_same_bytes(qat, tmp_path, capsys, monkeypatch):
    # Small chunks, so every tensor's error sums come from several chunks finishing out of order.
    monkeypatch.setattr(pipeline, "CHUNK_BYTES", 8192)
    _convert(qat, tmp_path / "a", capsys, "-j", "1")
    _convert(qat, tmp_path / "b", capsys, "-j", "3")
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    # repack.json differs only in the run's time: the error figures are the same too.
    a, b = (json.loads((tmp_path / d / "repack.json").read_text())["summary"] for d in "ab")
    assert a["int8_relative_error"] == b["int8_relative_error"]
    assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}


def test_builds_without_int8_record_no_int8_figure(tmp_path, capsys):
    write_micro_qat(tmp_path / "micro")  # linears on the grid that W4A16 recovers
    assert repack_q4_0.main(["repack", str(tmp_path / "micro"), str(tmp_path / "w4"), "-q"]) == 0
    assert "relative error" not in capsys.readouterr().out
    assert "int8_relative_error" not in json.loads((tmp_path / "w4" / "repack.json").read_text())["summary"]
