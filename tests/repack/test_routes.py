"""Step-by-step and one-pass routes agree byte for byte; outputs are lossless and valid."""

from __future__ import annotations

import json

import pytest
import torch
from compressed_tensors.quantization import QuantizationConfig

from repack.packing import unpack_int4
from tests.repack.conftest import TARGETS
from tests.safetensors_dir import tensors

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("target", TARGETS)
def test_one_pass_writes_the_same_tensors_as_the_steps(builds, target):
    a, b = tensors(builds[target]), tensors(builds[f"one-{target}"])
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert json.loads((builds[target] / "config.json").read_text()) == json.loads(
        (builds[f"one-{target}"] / "config.json").read_text()
    )


@pytest.mark.parametrize("target", TARGETS)
def test_config_validates_with_compressed_tensors(builds, target):
    cfg = json.loads((builds[target] / "config.json").read_text())
    qc = QuantizationConfig.model_validate(cfg["quantization_config"])
    assert qc.quantization_status == "compressed"
    if target != "w4a16":
        assert cfg["architectures"] == ["Gemma4ForCausalLM"] and "vision_config" not in cfg
    if target == "emb4":
        assert cfg["tie_word_embeddings"] is False
        targets = {t for g in cfg["quantization_config"]["config_groups"].values() for t in g["targets"]}
        assert {"re:.*embed_tokens$", "re:.*embed_tokens_per_layer$", "re:.*lm_head$"} <= targets


def test_w4a16_is_lossless_and_keeps_towers_linked(builds):
    src, out = tensors(builds["qat"]), tensors(builds["w4a16"])
    packed = [k for k in out if k.endswith(".weight_packed")]
    assert len(packed) > 50
    for k in packed:
        base = k[: -len(".weight_packed")]
        w = src[f"{base}.weight"]
        assert out[f"{base}.weight_scale"].shape == (w.shape[0], w.shape[1] // 32)
        assert out[f"{base}.weight_shape"].tolist() == list(w.shape)
        lv = unpack_int4(out[k], w.shape[1]).to(torch.float32).reshape(w.shape[0], -1, 32)
        deq = (lv * out[f"{base}.weight_scale"].float().unsqueeze(-1)).reshape(w.shape).to(torch.bfloat16)
        assert torch.equal(deq, w), base
    towers = [k for k in src if k.startswith("model.vision_tower.")]
    assert towers and all(torch.equal(src[k], out[k]) for k in towers)
    shard = "model-00002-of-00002.safetensors"
    assert (builds["w4a16"] / shard).stat().st_ino == (builds["qat"] / shard).stat().st_ino


def test_text_only_drops_towers_and_renames(builds):
    t = tensors(builds["text"])
    assert t and all(k.startswith(("model.", "lm_head")) for k in t)
    assert not any("tower" in k or "embed_vision" in k or "language_model" in k for k in t)


def test_shared_kv_layers_get_k_norm_in_both_layouts(builds):
    for key in ("text", "text-kv"):
        t = tensors(builds[key])
        cfg = json.loads((builds[key] / "config.json").read_text())
        for i in range(cfg["num_hidden_layers"]):
            assert f"model.layers.{i}.self_attn.k_norm.weight" in t, (key, i)
    assert "model.layers.9.self_attn.k_proj.weight_packed" in tensors(builds["text-kv"])


def test_stamp_records_source_and_version(builds):
    stamp = json.loads((builds["one-emb4"] / "repack.json").read_text())
    assert stamp["source"] == str(builds["qat"].resolve())
    assert len(stamp["source_fingerprint"]) == 64
    assert stamp["summary"]["off_grid_groups"] == 0
    assert stamp["steps"] == ["repack", "text_only", "embed_int4+embed_tokens"]
