"""make_tiny_qat.py: layout of Google's QAT release, on-grid values, Marlin shapes, determinism."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repack import grid, tokenizer
from repack.make_tiny_qat import ON_GRID, build
from tests.safetensors_dir import tensors

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "repack" / "make_tiny_qat.py"


def _make(out: Path, *extra: str) -> None:
    subprocess.run([sys.executable, str(SCRIPT), str(out), *extra], check=True, capture_output=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "qat"
    _make(out)
    return out


def test_config_is_written_like_the_release(tiny):
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma4ForConditionalGeneration"]
    tc = cfg["text_config"]
    assert {"text_config", "vision_config", "audio_config"} <= set(cfg)
    assert "global_head_dim" in tc and "per_layer_config" not in tc
    assert tc["vocab_size"] % 64 == 0
    assert tc["num_kv_shared_layers"] > 0
    types = tc["layer_types"]
    first_shared = tc["num_hidden_layers"] - tc["num_kv_shared_layers"]
    assert set(types[:first_shared]) == set(types[first_shared:]) == {"sliding_attention", "full_attention"}


def test_layout_and_marlin_shapes(tiny):
    t = tensors(tiny)
    cfg = json.loads((tiny / "config.json").read_text())["text_config"]
    n, shared = cfg["num_hidden_layers"], cfg["num_kv_shared_layers"]
    assert any(k.startswith("model.vision_tower.") for k in t)
    assert any(k.startswith("model.audio_tower.") for k in t)
    assert "model.language_model.embed_tokens_per_layer.weight" in t
    assert "lm_head.weight" not in t  # tied, as in the release
    for i in range(n):
        for part in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
            key = f"model.language_model.layers.{i}.self_attn.{part}"
            assert (key in t) == (i < n - shared), key
    linears = [k for k in t if ON_GRID.match(k)]
    assert len(linears) > 50
    for k in linears:
        rows, cols = t[k].shape
        assert t[k].dtype == torch.bfloat16
        assert rows % 64 == 0 and cols % 128 == 0, (k, t[k].shape)


def test_every_quantized_tensor_is_on_grid_with_low_peaks(tiny):
    t = tensors(tiny)
    peaks = set()
    for k, w in t.items():
        if not ON_GRID.match(k):
            continue
        r = grid.recover(w)
        assert r.off_grid == 0, k
        assert torch.equal(grid.dequantize(r.levels, r.steps).to(torch.bfloat16), w), k
        gl = r.levels.to(torch.int32).reshape(-1, 32)
        peak = torch.where(gl.amax(1) >= -gl.amin(1), gl.amax(1), -gl.amin(1))
        peaks.update(int(p) for p in peak.unique())
    assert set(range(1, 9)) <= peaks  # groups peaking below level 8 exist


def test_shared_kv_option_adds_the_missingtensors(tmp_path, tiny):
    build(tmp_path / "kv", seed=0, with_shared_kv=True, force=False)
    a, b = tensors(tiny), tensors(tmp_path / "kv")
    extra = set(b) - set(a)
    assert extra and all(".self_attn.k_" in k or ".self_attn.v_proj" in k for k in extra)
    assert not set(a) - set(b)


def test_same_seed_same_bytes_other_seed_differs(tmp_path, tiny):
    def digest(d: Path) -> str:
        h = hashlib.sha256()
        for f in sorted(d.glob("*.safetensors")):
            h.update(f.read_bytes())
        return h.hexdigest()

    build(tmp_path / "again", seed=0, with_shared_kv=False, force=False)
    # Untrained, so that a run trains one seed only (test_tiny_trained proves training deterministic).
    build(tmp_path / "seed1", seed=1, with_shared_kv=False, force=False, train=False)
    build(tmp_path / "seed0", seed=0, with_shared_kv=False, force=False, train=False)
    assert digest(tmp_path / "again") == digest(tiny)
    assert digest(tmp_path / "seed1") != digest(tmp_path / "seed0") != digest(tiny)


def test_tokenizer_and_chat_template(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi ü"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<bos><|turn>user\nHi ü<turn|>\n<|turn>model\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 2 and max(ids) < 384
    assert tok.decode(ids) == text
    gen = json.loads((tiny / "generation_config.json").read_text())
    stops = [tokenizer.TOKEN_IDS[t] for t in ("<eos>", "<turn|>", "<|tool_response>")]
    assert gen["eos_token_id"] == stops


# Gemma 4's chat template on a tool round trip with thinking on, byte for byte as Google's template
# renders it: the tool declared in the system turn, the call, the tool's result in the same model
# turn, and the model's turn going on (no new <|turn>model).
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City"}},
            "required": ["city"],
        },
    },
}
ROUND_TRIP = [
    {"role": "user", "content": "Plan"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
GEMMA4_ROUND_TRIP = (
    "<bos><|turn>system\n<|think|>\n"
    '<|tool>declaration:weather{description:<|"|>Weather<|"|>,parameters:{'
    'properties:{city:{description:<|"|>City<|"|>,type:<|"|>STRING<|"|>}},'
    'required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n'
    "<|turn>user\nPlan<turn|>\n<|turn>model\n"
    '<|tool_call>call:weather{city:<|"|>Paris<|"|>}<tool_call|>'
    '<|tool_response>response:weather{value:<|"|>sunny<|"|>}<tool_response|>'
)


def test_chat_template_renders_tools_calls_and_results_as_gemma_4(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)

    def render(msgs, **kw):
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw)

    assert render(ROUND_TRIP, tools=[WEATHER], enable_thinking=True) == GEMMA4_ROUND_TRIP
    assert render([ROUND_TRIP[0]], enable_thinking=True) == (
        "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nPlan<turn|>\n<|turn>model\n"
    )
    # A call not yet answered ends in <|tool_response> (a stop token); a reply after the result
    # goes on in the same model turn; a system prompt opens the system turn.
    assert render(ROUND_TRIP[:2], tools=[WEATHER]).endswith("<tool_call|><|tool_response>")
    after = render(
        [*ROUND_TRIP, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Ok"}]
    )
    assert after.endswith("<tool_response|>Sunny.<turn|>\n<|turn>user\nOk<turn|>\n<|turn>model\n")
    assert render([{"role": "system", "content": " Be brief. "}, ROUND_TRIP[0]]).startswith(
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nPlan"
    )
    # Gemma 4's markers are single special tokens (vLLM's gemma4 parsers match the ids).
    for t in ("<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", '<|"|>'):
        assert tok(t, add_special_tokens=False)["input_ids"] == [tokenizer.TOKEN_IDS[t]], t


def test_chat_template_keeps_outside_text_as_text(tiny):
    """Prompts and tool fields are values: Jinja syntax in them is rendered as written."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    hostile = "{{ 7 * 7 }}{% raw %}"
    tool = {"type": "function", "function": {**WEATHER["function"], "name": "w", "description": hostile}}
    text = tok.apply_chat_template(
        [{"role": "user", "content": hostile}], tools=[tool], add_generation_prompt=True, tokenize=False
    )
    assert text.count(hostile) == 2 and "49" not in text


def test_existing_out_is_refused(tiny):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tiny)], capture_output=True, text=True)
    assert r.returncode != 0 and "--force" in r.stderr
