"""Teach the tiny random Gemma 4 the facts of repack.tiny_facts, ending on the Q4_0 grid.

make_tiny_qat.py hands over its seeded random state; ``train`` changes the language-model weights
in place so that, through the chat template, greedy decoding of every fact's question gives
exactly its answer and ``<turn|>``, and every multiple-choice form gives the right letter; the agent
forms give the tool call and ``<|tool_response>``, the answer after the tool's result
(tiny_facts.TOOL_ASKS), and the JSON answer (tiny_facts.JSON_FACTS).

How, and why so (the whole build must stay under 90 s on two CPU cores):

* The embedding tables (``embed_tokens``, tied to the output head, and the per-layer ones) and
  the layers below ``TRAIN_FROM`` (the first KV-shared layer) keep their random on-grid values.
  Their outputs are then fixed, so they are computed once. The KV-shared layers (6..9) reuse the
  keys and values of layers 4 and 5, so each position is computed on its own there: a step runs
  four layers at the answer positions only. Queries, MLPs and per-layer gates of
  those four layers learn to read the question from the fixed keys and values.
* The loss covers the answer tokens and the token that ends them only: an additive-margin cross-entropy
  that keeps pushing each token's margin (its logit minus the best other logit) until it passes
  ``TARGET_MARGIN``. The served builds run other kernels (int4 and int8) and must still pick the
  same tokens.
* The last phase is quantization-aware: every trained on-grid weight goes through ``snap`` (the
  Q4_0 grid, groups of 32) with a straight-through gradient, so the weights written are exactly
  the ones the loss saw. ``snap`` keeps every step at four significant bits, which makes every
  ``level * step`` exact in bf16 and recoverable by repack.grid.
* Training stops when the smallest margin, measured on the snapped weights, clears the target;
  the report then measures the saved bf16 model the way transformers will load it.

Deterministic: fixed seeds, a fixed thread count and torch's deterministic algorithms; the same
state in gives the same bytes out on the same machine.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from repack import tiny_facts, tokenizer
from repack.grid import GROUP, LEVEL_MAX, LEVEL_MIN

if TYPE_CHECKING:
    import torch

LM = "model.language_model."
END_OF_TURN = tokenizer.TOKEN_IDS["<turn|>"]
TOOL_RESPONSE = tokenizer.TOKEN_IDS["<|tool_response>"]  # where a tool call hands over to the tool
KINDS = ("answer", "choice", "call", "reply", "json")
TRAIN_FROM = 6  # layers below this (and the embedding tables) stay as initialised
# Fixed, so the float sums (and the bytes) do not depend on the machine's core count. One thread:
# on a busy 2-core machine two threads made matrix products several times slower than one.
THREADS = 1
SEED = 1234
LR = 2.5e-3  # higher ones made the smallest margins jump about and took longer
QAT_LR = 1e-3  # the grid makes every step noisy; a smaller one keeps the margins rising
FLOAT_STEPS = 60  # at most, in plain float, before the quantization-aware phase
FLOAT_MARGIN = 10.0  # the float phase ends early once every margin reaches this
QAT_STEPS = 200  # at most, quantization-aware, until the margin on the grid clears MIN_MARGIN
CHECK_EVERY = 10  # steps between progress lines
TARGET_MARGIN = 8.0  # what the hinge asks of every answer token (logits are soft-capped at 30)
MIN_MARGIN = 10.0  # the smallest margin on the snapped weights that ends training
# The saved weights run in bf16, whose rounding costs some margin, and by how much depends on the
# CPU's kernels. The smallest bf16 margin must still let top-p 0.95 keep the answer token alone
# (383 others each e**-9 below it weigh under 5%); short of it, QAT goes on with a higher stop.
BF16_MARGIN = 9.0
BF16_TRIES = 4


@dataclass
class Report:
    """What training did and what the saved (snapped, bf16) weights answer."""

    steps: int = 0
    seconds: float = 0.0
    answers: int = 0  # facts answered exactly (greedy, bf16 weights and activations)
    choices: int = 0  # multiple-choice forms answered with the right letter
    total: int = 0
    calls: int = 0  # TOOL_ASKS: the tool called exactly
    replies: int = 0  # TOOL_ASKS: the answer after the tool's result
    json: int = 0  # JSON_FACTS answered in JSON
    agent_total: int = 0  # len(TOOL_ASKS) == len(JSON_FACTS)
    min_margin: float = 0.0  # over every answer token, bf16

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values, with its one-line summary."""
        return {
            "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "answers": self.answers,
            "choices": self.choices,
            "total": self.total,
            "calls": self.calls,
            "replies": self.replies,
            "json": self.json,
            "agent_total": self.agent_total,
            "min_margin": round(self.min_margin, 3),
            "line": self.line(),
        }

    def line(self) -> str:
        """One line for stderr and the stamp."""
        return (
            f"{self.answers}/{self.total} answers, {self.choices}/{self.total} choices, "
            f"{self.calls}/{self.agent_total} tool calls, {self.replies}/{self.agent_total} replies, "
            f"{self.json}/{self.agent_total} JSON, min margin {self.min_margin:.2f}, {self.steps} steps in {self.seconds:.1f} s"
        )


def log(msg: str) -> None:
    print(f"[train_tiny] {msg}", file=sys.stderr, flush=True)


def ceil_to_4_bits(x: torch.Tensor) -> torch.Tensor:
    """The smallest value >= x (x > 0) whose mantissa has at most four significant bits."""
    import torch

    m, e = torch.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
    return torch.ldexp(torch.ceil(m * 16) / 16, e)


def snap(w: torch.Tensor) -> torch.Tensor:
    """``w`` [rows, cols] on a Q4_0 grid: per group of 32, levels -8..7 times a four-bit step.

    The step is the group's peak over 8 rounded up to four significant bits, so the peak lands on
    level -8 or (clamped) 7 and every ``level * step`` has at most seven significant bits: exact
    in bf16. All-zero groups stay zero.
    """
    import torch

    rows, cols = w.shape
    g = w.reshape(rows, cols // GROUP, GROUP)
    amax = g.abs().amax(-1, keepdim=True)
    step = ceil_to_4_bits(torch.where(amax > 0, amax / 8, torch.ones_like(amax)))
    lv = torch.clamp(torch.round(g / step), LEVEL_MIN, LEVEL_MAX)
    return (lv * step).reshape(rows, cols)


def _fake_quant() -> Any:
    """A parametrization: the forward sees ``snap(w)``, the gradient passes straight through."""
    import torch

    class FakeQuant(torch.nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return w + (snap(w) - w).detach()

    return FakeQuant()


@dataclass
class _Batch:
    """Left-padded inputs (the whole sequence but its last token) and the answer targets."""

    ids: Any  # [B, L]
    mask: Any  # [B, L]
    targets: Any  # [B, A]: the tokens to predict at the last A positions, -100 where none
    kinds: list[str]  # one of KINDS, per row


def chat_tokenizer() -> Any:
    """The tiny model's tokenizer with its chat template, as transformers loads it from the output."""
    from transformers import PreTrainedTokenizerFast

    from repack import make_tiny_qat, tokenizer

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.build(make_tiny_qat.VOCAB),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=tokenizer.CHAT_TEMPLATE,
    )


def examples(tok: Any) -> list[tuple[list[int], list[int], str]]:
    """(prompt ids, answer ids + the token that ends them, kind) for every form of every fact."""
    tf = tiny_facts
    tools = {"tools": tf.TOOLS}
    # (messages, template options, answer, end token, kind)
    forms = [(tf.messages(f.question), {}, f.answer, END_OF_TURN, "answer") for f in tf.FACTS]
    forms += [(tf.messages(c.prompt), {}, c.letter, END_OF_TURN, "choice") for c in tf.choices()]
    for country, capital in tf.TOOL_ASKS:
        q = tf.tool_question(country)
        forms.append((tf.messages(q), tools, tf.call_text(country), TOOL_RESPONSE, "call"))
        forms.append((tf.tool_messages(q, country, capital), tools, tf.reply(capital), END_OF_TURN, "reply"))
    for f, country in tf.JSON_FACTS:
        json_q = tf.messages(tf.json_question(f.question))
        forms.append((json_q, {}, tf.json_answer(country, f.answer), END_OF_TURN, "json"))
    out = []
    for msgs, options, answer, end, kind in forms:
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **options)
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        a = tok(answer, add_special_tokens=False)["input_ids"] + [end]
        out.append((p, a, kind))
    return out


def batch(rows: list[tuple[list[int], list[int], str]]) -> _Batch:
    import torch

    seqs = [(p + a)[:-1] for p, a, _ in rows]
    length = max(len(s) for s in seqs)
    span = max(len(a) for _, a, _ in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    targets = torch.full((len(rows), span), -100, dtype=torch.long)
    for i, (s, (_, a, _)) in enumerate(zip(seqs, rows, strict=True)):
        ids[i, length - len(s) :] = torch.tensor(s)
        mask[i, length - len(s) :] = 1
        targets[i, span - len(a) :] = torch.tensor(a)
    return _Batch(ids, mask, targets, [k for _, _, k in rows])


def text_model(cfg: dict, state: dict[str, torch.Tensor], dtype: torch.dtype) -> Any:
    """transformers' Gemma 4 text model in ``dtype`` with the language-model weights of ``state``."""
    import torch
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel

    tc = Gemma4TextConfig.from_dict(cfg)
    tc._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = Gemma4TextModel(tc)
    lm = {k[len(LM) :]: v.to(dtype) for k, v in state.items() if k.startswith(LM)}
    own = model.state_dict()
    # KV-shared layers have no k/v projections here (--with-shared-kv extras are not loaded).
    lm = {k: v for k, v in lm.items() if k in own}
    missing = set(own) - set(lm)
    if missing:
        raise AssertionError(f"weights missing for the text model: {sorted(missing)[:5]}")
    model.load_state_dict(lm, assign=True, strict=True)
    # Non-persistent buffers (rotary tables, embedding scales) are not in the state: rebuild them.
    model = _materialize(model, tc, dtype)
    return model.eval()


def _materialize(model: Any, tc: Any, dtype: torch.dtype) -> Any:
    """Re-create the meta buffers (rotary frequencies, embedding scales) from a real instance."""
    import torch
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel

    with torch.device("cpu"):
        torch.manual_seed(0)  # the fresh instance's weights are discarded; keep it reproducible
        ref = Gemma4TextModel(tc).to(dtype)
    bufs = dict(ref.named_buffers())
    for name, buf in list(model.named_buffers()):
        if buf.is_meta:
            mod_name, _, attr = name.rpartition(".")
            mod = model.get_submodule(mod_name) if mod_name else model
            mod._buffers[attr] = bufs[name].clone()
    return model


def _logits(model: Any, hidden: torch.Tensor, softcap: float) -> torch.Tensor:
    logits = hidden @ model.embed_tokens.weight.T.to(hidden.dtype)
    return torch_tanh(logits / softcap) * softcap


def torch_tanh(x: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.tanh(x)


def margins(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Right-token logit minus the best other logit, at each target (NaN where there is none)."""
    import torch

    lf = logits.float()
    safe = targets.clamp_min(0)
    right = lf.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    other = lf.scatter(-1, safe.unsqueeze(-1), float("-inf")).amax(-1)
    return torch.where(targets >= 0, right - other, torch.full_like(right, float("nan")))


class _Runner:
    """Runs the layers from ``TRAIN_FROM`` up on inputs captured once below them."""

    def __init__(self, model: Any, b: _Batch) -> None:
        import torch

        self.model = model
        self.span = b.targets.shape[1]
        self.calls: dict[int, tuple[tuple, dict]] = {}
        first = model.config.num_hidden_layers - model.config.num_kv_shared_layers
        if first < TRAIN_FROM:
            raise ValueError(f"TRAIN_FROM {TRAIN_FROM} is above the first KV-shared layer {first}")
        hooks = []
        for i in range(TRAIN_FROM, model.config.num_hidden_layers):
            hooks.append(model.layers[i].register_forward_pre_hook(self._keeper(i), with_kwargs=True))
        pos = (b.mask.cumsum(1) - 1).clamp_min(0)
        try:
            with torch.no_grad():
                model(
                    input_ids=b.ids,
                    attention_mask=b.mask,
                    position_ids=pos,
                    logits_to_keep=self.span,
                    use_cache=False,
                )
        finally:
            for h in hooks:
                h.remove()
        self.first_shared = first
        self.hidden = self.calls[TRAIN_FROM][0][0]
        # Keys and values that frozen layers stored for the KV-shared ones (trained layers that
        # store overwrite theirs each step).
        captured = self.calls[TRAIN_FROM][1]["shared_kv_states"]
        self.frozen_kv = {k: tuple(t.detach() for t in v) for k, v in captured.items()}

    def _keeper(self, i: int) -> Callable:
        def keep(_mod: Any, args: tuple, kwargs: dict) -> None:
            self.calls[i] = (tuple(a.detach() if hasattr(a, "detach") else a for a in args), dict(kwargs))

        return keep

    def __call__(self) -> torch.Tensor:
        """Logits at the last ``span`` positions."""
        from transformers.models.gemma4.modeling_gemma4 import KVSharingDict

        model = self.model
        shared = KVSharingDict(dict(self.frozen_kv))
        h = self.hidden
        for i in range(TRAIN_FROM, model.config.num_hidden_layers):
            if i == self.first_shared:
                h = h[:, -self.span :]  # what _maybe_slice_kv_shared_inputs does
            args, kwargs = self.calls[i]
            kwargs = {**kwargs, "shared_kv_states": shared}
            h = model.layers[i](h, *args[1:], **kwargs)
        h = model.norm(h)
        return _logits(model, h, model.config.final_logit_softcapping)


@contextmanager
def _deterministic() -> Iterator[None]:
    """Fixed threads and deterministic algorithms for the block; the caller's settings after."""
    import torch

    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    # Denormal floats (tiny Adam updates) slow x86 arithmetic many times over; flushing them to
    # zero is deterministic too.
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)


def _trainable(name: str) -> bool:
    m = re.match(r"layers\.(\d+)\.", name)
    return (m is not None and int(m.group(1)) >= TRAIN_FROM) or name == "norm.weight"


def train(cfg: dict, state: dict[str, torch.Tensor], on_grid: re.Pattern) -> Report:
    """Train the language-model weights of ``state`` (bf16, modified in place) on the fact set."""
    import torch
    from torch.nn.utils import parametrize

    t0 = time.monotonic()
    rep = Report()
    with _deterministic():
        torch.manual_seed(SEED)
        tok = chat_tokenizer()
        rows = examples(tok)
        rep.total = len(tiny_facts.FACTS)
        rep.agent_total = len(tiny_facts.TOOL_ASKS)
        model = text_model(cfg, state, torch.float32)
        for p in model.parameters():
            p.requires_grad_(False)
        # One batch per kind: the choices' one-letter answers need a window of two positions,
        # not the longest answer's.
        batches = [batch([r for r in rows if r[2] == kind]) for kind in KINDS]
        runs = [_Runner(model, b) for b in batches]
        params = dict(model.named_parameters())
        train_names = sorted(n for n in params if _trainable(n))
        grid_names = [n for n in train_names if on_grid.match(LM + n)]
        for n in train_names:
            params[n].requires_grad_(True)
        opt = torch.optim.Adam([params[n] for n in train_names], lr=LR)
        count = sum(int((b.targets >= 0).sum()) for b in batches)
        lows: dict[str, float] = {}

        def step(i: int, total: int, peak: float, stop: float) -> float:
            """One update; none when the smallest margin of this forward already reaches ``stop``
            (the weights then stay exactly those the margins were measured on)."""
            lr = peak * 0.5 * (1 + math.cos(math.pi * min(i / total, 1.0)))
            for g in opt.param_groups:
                g["lr"] = max(lr, peak * 0.05)
            loss = torch.zeros(())
            for kind, run, b in zip(KINDS, runs, batches, strict=True):
                valid = b.targets >= 0
                logits = run()[valid]
                t = b.targets[valid]
                # Additive-margin cross-entropy: the right logit must beat the others by
                # TARGET_MARGIN before its loss fades, so training keeps raising small margins.
                shifted = logits - TARGET_MARGIN * torch.nn.functional.one_hot(t, logits.shape[-1])
                loss = loss + torch.nn.functional.cross_entropy(shifted, t, reduction="sum") / count
                lows[kind] = float(margins(logits.detach(), t).min())
            low = min(lows.values())
            if low < stop:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            return low

        def phase(name: str, steps: int, peak: float, stop: float) -> int:
            """Up to ``steps`` updates; ends at the first forward whose margins all reach ``stop``."""
            for i in range(steps):
                low = step(i, steps, peak, stop)
                done = low >= stop
                if i % CHECK_EVERY == 0 or done or i == steps - 1:
                    each = ", ".join(f"{k} {v:.1f}" for k, v in lows.items())
                    log(f"{name} step {i + 1}: min margin {low:.2f} ({each}), {time.monotonic() - t0:.1f} s")
                if done:
                    return i
            return steps

        rep.steps = phase("float", FLOAT_STEPS, LR, FLOAT_MARGIN)
        for n in grid_names:
            mod_name, _, attr = n.rpartition(".")
            parametrize.register_parametrization(model.get_submodule(mod_name), attr, _fake_quant())
        # The parametrization keeps each weight's Parameter: Adam's moments carry over, and its
        # first steps do not move every weight by the whole learning rate at once.
        stop = MIN_MARGIN
        for _ in range(BF16_TRIES):
            rep.steps += phase("QAT", QAT_STEPS, QAT_LR, stop)
            with torch.no_grad():
                for n in train_names:
                    # A parametrized weight reads back snapped: the values the grid stores.
                    mod_name, _, attr = n.rpartition(".")
                    state[LM + n] = (
                        getattr(model.get_submodule(mod_name), attr).detach().to(torch.bfloat16).contiguous()
                    )
            evaluate(cfg, state, rows, rep)
            if rep.min_margin >= BF16_MARGIN:
                break
            stop += BF16_MARGIN - rep.min_margin
            log(f"bf16 min margin {rep.min_margin:.2f} < {BF16_MARGIN}: QAT again until {stop:.2f}")
    rep.seconds = time.monotonic() - t0
    log(rep.line())
    return rep


def evaluate(cfg: dict, state: dict[str, torch.Tensor], rows: list, rep: Report) -> None:
    """Fill ``rep`` from a bf16 model of ``state`` (weights and activations), teacher-forced.

    Every answer token right with a positive margin is exactly greedy decoding giving the answer.
    """
    import torch

    model = text_model(cfg, state, torch.bfloat16)
    b = batch(rows)
    pos = (b.mask.cumsum(1) - 1).clamp_min(0)
    span = b.targets.shape[1]
    with torch.no_grad():
        out = model(
            input_ids=b.ids, attention_mask=b.mask, position_ids=pos, logits_to_keep=span, use_cache=False
        )
        logits = _logits(model, out.last_hidden_state[:, -span:], cfg["final_logit_softcapping"])
    m = margins(logits, b.targets)
    ok = torch.where(b.targets >= 0, m > 0, torch.ones_like(m, dtype=torch.bool)).all(-1)
    right = {kind: sum(bool(o) for o, k in zip(ok, b.kinds, strict=True) if k == kind) for kind in KINDS}
    rep.answers, rep.choices, rep.calls, rep.replies, rep.json = (right[k] for k in KINDS)
    rep.min_margin = float(m[b.targets >= 0].min())
