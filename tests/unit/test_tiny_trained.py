"""The trained tiny model: it knows the facts in transformers (bf16 and a simulated W8A8), calls
the tool, answers after its result and answers in JSON as an agent asks (tiny_facts.TOOL_ASKS,
JSON_FACTS), it is
exactly on the Q4_0 grid, its training is deterministic, and the cache trains once per input."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from repack import grid, make_tiny_qat, tiny_facts, tokenizer, train_tiny
from repack.make_tiny_qat import ON_GRID, build
from tests.safetensors_dir import tensors

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "repack" / "make_tiny_qat.py"
EOT = "<turn|>"
# Top-p 0.95 keeps the top token alone when the other VOCAB - 1 together weigh at most 5% of
# everything, i.e. at most 1/19 of the top one: each at least log(19 * (VOCAB - 1)) below it.
NUCLEUS_MARGIN = math.log(19 * (make_tiny_qat.VOCAB - 1))
# Where the model stops: <eos>, the end of its turn, or a tool call handing over to the tool.
STOPS = [tokenizer.TOKEN_IDS[t] for t in ("<eos>", EOT, "<|tool_response>")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """Seed 0, trained: from the default cache, which the other tiny builds of a run share."""
    out = tmp_path_factory.mktemp("tiny-trained") / "qat"
    build(out, seed=0, with_shared_kv=False, force=False)
    return out


def greedy(model, tok, chats: list[list[dict]], max_new_tokens: int = 16, **options) -> list[str]:
    """Greedy continuations of each chat through the template (one left-padded batch), up to and
    with the first stop token, special tokens shown."""
    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False, **options) for m in chats]
    enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(
            **enc, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=STOPS, pad_token_id=0
        )
    out = []
    for row in ids[:, enc["input_ids"].shape[1] :].tolist():
        stop = next((i for i, t in enumerate(row) if t in STOPS), len(row) - 1)
        out.append(tok.decode(row[: stop + 1]))
    return out


def misses(got: list[str], want: list[str]) -> list[str]:
    return [f"{w!r} -> {g!r}" for w, g in zip(want, got, strict=True) if g != w]


def scores(model, tok) -> tuple[list[str], list[str]]:
    """Misses of the facts and of the multiple-choice forms, as 'expected -> got'."""
    facts, forms = tiny_facts.FACTS, tiny_facts.choices()
    got = greedy(model, tok, [tiny_facts.messages(f.question) for f in facts])
    got_mc = greedy(model, tok, [tiny_facts.messages(c.prompt) for c in forms])
    return misses(got, [f.answer + EOT for f in facts]), misses(got_mc, [c.letter + EOT for c in forms])


def agent_scores(model, tok) -> list[str]:
    """Misses of the agent forms: the tool call (tools declared) and the answer after the tool's
    result for TOOL_ASKS, the JSON answer for JSON_FACTS."""
    tf = tiny_facts
    tools = {"tools": tf.TOOLS, "max_new_tokens": 48}
    asks = [(tf.tool_question(c), c, cap) for c, cap in tf.TOOL_ASKS]
    calls = greedy(model, tok, [tf.messages(q) for q, _, _ in asks], **tools)
    replies = greedy(model, tok, [tf.tool_messages(q, c, cap) for q, c, cap in asks], **tools)
    json_asks = [tf.messages(tf.json_question(f.question)) for f, _ in tf.JSON_FACTS]
    json_got = greedy(model, tok, json_asks, max_new_tokens=48)
    return (
        misses(calls, [tf.call_text(c) + "<|tool_response>" for _, c, _ in asks])
        + misses(replies, [tf.reply(cap) + EOT for _, _, cap in asks])
        + misses(json_got, [tf.json_answer(c, f.answer) + EOT for f, c in tf.JSON_FACTS])
    )


def _int8(model, activations: bool) -> None:
    """Swap every on-grid language-model linear for W8A8's arithmetic: int8 weights per output
    channel (symmetric) and, with ``activations``, int8 inputs per token; embeddings stay bf16."""

    class Int8(torch.nn.Module):
        def __init__(self, lin: torch.nn.Linear) -> None:
            super().__init__()
            w = lin.weight.float()
            s = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
            self.weight = torch.nn.Parameter(
                (torch.round(w / s) * s).to(lin.weight.dtype), requires_grad=False
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if activations:
                xf = x.float()
                s = xf.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
                x = (torch.round(xf / s) * s).to(x.dtype)
            return torch.nn.functional.linear(x, self.weight)

    for name, mod in list(model.named_modules()):
        if isinstance(mod, torch.nn.Linear) and ON_GRID.match(f"{name}.weight"):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, Int8(mod))


def test_knows_every_fact_in_bf16_and_simulated_w8a8(tiny, figure):
    from transformers import AutoTokenizer, Gemma4ForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(tiny)
    model = Gemma4ForConditionalGeneration.from_pretrained(tiny, dtype=torch.bfloat16).eval()
    assert scores(model, tok) == ([], [])
    assert agent_scores(model, tok) == []
    _int8(model, activations=True)
    miss, miss_mc = scores(model, tok)
    n = len(tiny_facts.FACTS)
    assert len(miss) <= n // 10 and len(miss_mc) <= n // 10, (miss, miss_mc)
    agent_miss = agent_scores(model, tok)
    assert agent_miss == [], agent_miss
    stamp = json.loads((tiny / make_tiny_qat.STAMP).read_text())
    figure(
        "tiny model, simulated W8A8 (int8 weights per channel, int8 activations per token)",
        f"{n - len(miss)}/{n} answers, {n - len(miss_mc)}/{n} choices, {len(agent_miss)} agent misses; "
        f"bf16: {stamp['training']['line']}",
    )


def test_every_on_grid_tensor_is_exactly_on_the_grid(tiny):
    t = tensors(tiny)
    names = [k for k in t if ON_GRID.match(k)]
    assert names and all(grid.recover(t[k]).off_grid == 0 for k in names)
    # Norms and scalars are bf16 as well; the trained layers moved off their random start.
    assert all(v.dtype == torch.bfloat16 for k, v in t.items() if k.startswith(make_tiny_qat.LM))
    stamp = json.loads((tiny / make_tiny_qat.STAMP).read_text())
    rep = stamp["training"]
    assert rep["answers"] == rep["choices"] == rep["total"] == len(tiny_facts.FACTS)
    assert (
        rep["calls"] == rep["replies"] == rep["json"] == rep["agent_total"] == len(tiny_facts.TOOL_ASKS) > 0
    )
    # Training stops at MIN_MARGIN on the grid in float32; in bf16 every answer token must still
    # hold the top-p (0.95) nucleus alone, which the smoke test's sampling relies on.
    assert rep["min_margin"] >= NUCLEUS_MARGIN


def test_training_is_deterministic(monkeypatch):
    """Two short trainings of one state give the same bytes (the full one runs the same code)."""
    for name, value in (("FLOAT_STEPS", 2), ("QAT_STEPS", 2), ("CHECK_EVERY", 1)):
        monkeypatch.setattr(train_tiny, name, value)
    cfg = make_tiny_qat.full_config()
    start = make_tiny_qat.random_state(cfg, 0)
    start.pop("lm_head.weight")  # tied to embed_tokens: one tensor, and the release omits it
    digests = []
    for _ in range(2):
        state = dict(start)
        train_tiny.train(cfg["text_config"], state, ON_GRID)
        digests.append(hashlib.sha256(save(state)).hexdigest())
    assert digests[0] == digests[1]
    assert hashlib.sha256(save(start)).hexdigest() != digests[0]


def test_same_inputs_hit_the_cache_other_inputs_miss(tmp_path, tiny, monkeypatch, figure):
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "again")], check=True, capture_output=True, text=True
    )
    figure("tiny build from the training cache", f"{time.monotonic() - t0:.1f} s")
    # Served from the cache: no training step ran (it logs each under [train_tiny]).
    assert "[train_tiny]" not in r.stderr and "from the cache" in r.stderr
    assert r.stdout.strip() == "built"
    for f in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", make_tiny_qat.STAMP):
        assert (tmp_path / "again" / f).read_bytes() == (tiny / f).read_bytes(), f

    key = make_tiny_qat.training_key(0)
    assert make_tiny_qat.training_key(1) != key
    monkeypatch.setattr(tiny_facts, "FACTS", tiny_facts.FACTS[:-1])
    assert make_tiny_qat.training_key(0) != key

    # A changed fact set is a miss: it trains (stubbed here) and keeps the result under its key.
    calls = []

    def fake_train(cfg, state, on_grid):
        calls.append(1)
        return train_tiny.Report(total=len(tiny_facts.FACTS))

    monkeypatch.setattr(train_tiny, "train", fake_train)
    cfg = make_tiny_qat.full_config()
    state = make_tiny_qat.random_state(cfg, 0)
    make_tiny_qat.trained(state, cfg, 0, tmp_path / "cache")
    make_tiny_qat.trained(state, cfg, 0, tmp_path / "cache")
    assert calls == [1]
    assert (tmp_path / "cache" / make_tiny_qat.training_key(0) / "lm.safetensors").is_file()


def test_update_rebuilds_only_when_the_inputs_change(tmp_path, tiny):
    import shutil

    out = tmp_path / "qat"
    shutil.copytree(tiny, out)
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--update"], check=True, capture_output=True, text=True
    )
    assert r.stdout.strip() == "unchanged"
    stamp = json.loads((out / make_tiny_qat.STAMP).read_text())
    (out / make_tiny_qat.STAMP).write_text(json.dumps({**stamp, "digest": "older inputs"}))
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--update"], check=True, capture_output=True, text=True
    )
    assert r.stdout.strip() == "built"
    assert (out / make_tiny_qat.STAMP).read_bytes() == (tiny / make_tiny_qat.STAMP).read_bytes()
    # A tiny build from before builds were stamped (a developer's build/ directory) is replaced too.
    (out / make_tiny_qat.STAMP).unlink()
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--update"], check=True, capture_output=True, text=True
    )
    assert r.stdout.strip() == "built"
    assert (out / make_tiny_qat.STAMP).read_bytes() == (tiny / make_tiny_qat.STAMP).read_bytes()
    # A directory that is not a tiny build is not replaced without --force.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep").write_text("x")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "other"), "--update"], capture_output=True, text=True
    )
    assert r.returncode != 0 and "--force" in r.stderr and (tmp_path / "other" / "keep").is_file()
