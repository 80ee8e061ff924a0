#!/usr/bin/env python3
"""Build a tiny Gemma 4 in the multimodal layout of Google's QAT release, trained to know some facts.

    python repack/make_tiny_qat.py OUT [--seed N] [--with-shared-kv] [--force | --update]
                                       [--untrained] [--cache DIR | --no-cache]

The checkpoint mirrors google/gemma-4-E2B-it-qat-q4_0-unquantized at toy scale: a config.json
with text/vision/audio configs written the way the release writes them, `model.language_model.*`
names, vision and audio towers, per-layer embeddings, KV-shared layers without k_proj/v_proj/
k_norm (unless --with-shared-kv), bf16 values with every language-model linear and embedding
table on a Q4_0 grid (groups of 32, levels -8..7, steps exact in bf16, peaks at every level 1..8),
a locally built tokenizer with a Gemma-style chat template, and generation_config.json.
Every linear satisfies Marlin (out % 64 == 0, in % 128 == 0); the vocabulary is a multiple of 64.

The weights start seeded and random; repack/train_tiny.py then trains the language model (on the
CPU, about a minute) so that greedy decoding answers every question of repack/tiny_facts.py
exactly ("What is the capital of France?" -> "Paris") and every multiple-choice form with the
right letter, ending quantization-aware and snapped onto the Q4_0 grid (--untrained skips it).
The trained weights are cached by a digest of their inputs (seed, facts, training code, torch and
transformers versions), and OUT records its inputs' digest in tiny_qat.json: --update rebuilds
only when that digest changes, which is how the repack role decides.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import sys
from importlib import metadata
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from typing import TYPE_CHECKING

from repack import tiny_facts
from repack.outdir import atomic_dir

if TYPE_CHECKING:
    import torch

# torch, safetensors, the grid and the tokenizer are imported where they are used: `--update` on an
# unchanged build needs none of them (the repack role runs it on every site.yml; torch alone takes
# seconds to import).

NUM_LAYERS = 10
KV_SHARED = 4
VOCAB = 384
HIDDEN = 256
PER_LAYER = 128
LM = "model.language_model."
# Language-model tensors that the QAT release stores on the Q4_0 grid.
ON_GRID = re.compile(
    r"^model\.language_model\.(embed_tokens|embed_tokens_per_layer|per_layer_model_projection"
    r"|layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|per_layer_input_gate|per_layer_projection))"
    r"\.weight$"
)


def text_config() -> dict:
    """The text config, with keys as Google's release writes them (global_head_dim, not per_layer_config)."""
    return {
        "architectures": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": False,
        "bos_token_id": 2,
        "dtype": "bfloat16",
        "enable_moe_block": False,
        "eos_token_id": 1,
        "expert_intermediate_size": None,
        "final_logit_softcapping": 30.0,
        "global_head_dim": 128,
        "head_dim": 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": HIDDEN,
        "hidden_size_per_layer_input": PER_LAYER,
        "initializer_range": 0.02,
        "intermediate_size": 512,
        "layer_types": ["full_attention" if i % 5 == 4 else "sliding_attention" for i in range(NUM_LAYERS)],
        "max_position_embeddings": 4096,
        "model_type": "gemma4_text",
        "num_attention_heads": 2,
        "num_experts": None,
        "num_global_key_value_heads": None,
        "num_hidden_layers": NUM_LAYERS,
        "num_key_value_heads": 1,
        "num_kv_shared_layers": KV_SHARED,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 512,
        "tie_word_embeddings": True,
        "top_k_experts": None,
        "use_bidirectional_attention": None,
        "use_cache": True,
        "use_double_wide_mlp": True,
        "vocab_size": VOCAB,
        "vocab_size_per_layer_input": VOCAB,
    }


def vision_config() -> dict:
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "default_output_length": 16,
        "dtype": "bfloat16",
        "head_dim": 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": 131072,
        "model_type": "gemma4_vision",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "patch_size": 16,
        "pooling_kernel_size": 3,
        "position_embedding_size": 256,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"},
        "standardize": False,
        "use_clipped_linears": True,
    }


def audio_config() -> dict:
    return {
        "attention_chunk_size": 12,
        "attention_context_left": 13,
        "attention_context_right": 0,
        "attention_invalid_logits_value": -1000000000.0,
        "attention_logit_cap": 50.0,
        "conv_kernel_size": 5,
        "dtype": "bfloat16",
        "gradient_clipping": 10000000000.0,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "model_type": "gemma4_audio",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "output_proj_dims": HIDDEN,
        "residual_weight": 0.5,
        "rms_norm_eps": 1e-06,
        "subsampling_conv_channels": [16, 8],
        "use_clipped_linears": True,
    }


def full_config() -> dict:
    """The top-level multimodal config.json."""
    tc = text_config()
    tc.pop("architectures")
    from repack import tokenizer

    ids = tokenizer.TOKEN_IDS
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "audio_config": audio_config(),
        "audio_token_id": ids["<audio_soft_token>"],
        "boa_token_id": ids["<start_of_audio>"],
        "boi_token_id": ids["<start_of_image>"],
        "dtype": "bfloat16",
        "eoa_token_id": ids["<end_of_audio>"],
        "eoa_token_index": ids["<end_of_audio>"],
        "eoi_token_id": ids["<end_of_image>"],
        "eos_token_id": [ids["<eos>"], ids["<turn|>"], ids["<|tool_response>"]],
        "image_token_id": ids["<image_soft_token>"],
        "initializer_range": 0.02,
        "model_type": "gemma4",
        "text_config": tc,
        "tie_word_embeddings": True,
        "transformers_version": "5.5.0",
        "video_token_id": ids["<video_soft_token>"],
        "vision_config": vision_config(),
        "vision_soft_tokens_per_image": 16,
    }


def random_state(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Instantiate transformers' Gemma 4 from ``cfg`` (seeded) and return its bf16 state dict."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(Gemma4Config.from_dict(json.loads(json.dumps(cfg))))
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}


def shared_kv_extras(state: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """k_proj, v_proj and k_norm for the KV-shared layers, shaped like their layer type's owners."""
    import torch

    from repack import grid

    extras = {}
    types = text_config()["layer_types"]
    first_shared = NUM_LAYERS - KV_SHARED
    for i in range(first_shared, NUM_LAYERS):
        owner = max(j for j in range(first_shared) if types[j] == types[i])
        for part in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
            ref = state[f"{LM}layers.{owner}.self_attn.{part}"]
            extras[f"{LM}layers.{i}.self_attn.{part}"] = (
                grid.random_on_grid(tuple(ref.shape), gen) if ref.dim() == 2 else torch.ones_like(ref)
            )
    return extras


# The record in OUT of what it was built from (make_tiny_qat.py --update compares it).
STAMP = "tiny_qat.json"
# Sources whose every byte can change the trained weights: a change is a cache miss.
HERE = Path(__file__).resolve().parent
TRAINING_SOURCES = ("make_tiny_qat.py", "train_tiny.py", "tiny_facts.py", "tokenizer.py", "grid.py")


def default_cache() -> Path:
    """$GEMMA_RIG_TINY_CACHE, else $XDG_CACHE_HOME/gemma-rig/tiny (~/.cache/gemma-rig/tiny)."""
    if os.environ.get("GEMMA_RIG_TINY_CACHE"):
        return Path(os.environ["GEMMA_RIG_TINY_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gemma-rig" / "tiny"


def training_key(seed: int) -> str:
    """sha256 of what the trained weights depend on: the seed, the facts, the code, torch and transformers."""
    h = hashlib.sha256()
    doc = {
        "seed": seed,
        "facts": tiny_facts.digest(),
        "torch": metadata.version("torch"),
        "transformers": metadata.version("transformers"),
        "sources": {n: hashlib.sha256((HERE / n).read_bytes()).hexdigest() for n in TRAINING_SOURCES},
    }
    h.update(json.dumps(doc, sort_keys=True).encode())
    return h.hexdigest()


def inputs_digest(seed: int, with_shared_kv: bool, train: bool) -> str:
    """sha256 of every input of a build: what OUT's stamp records and --update compares."""
    doc = {"training": training_key(seed) if train else None, "seed": seed, "with_shared_kv": with_shared_kv}
    if not train:  # the untrained model depends on the code too
        doc["sources"] = training_key(seed)
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def recorded_digest(out: Path) -> str | None:
    """The digest OUT's stamp records, or None when OUT holds no tiny build."""
    try:
        return json.loads((out / STAMP).read_text())["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def older_tiny_build(out: Path) -> bool:
    """True when OUT holds a tiny build made before builds were stamped: its config is this
    script's text model (vocabulary, widths, layers), so replacing it loses nothing of the user's."""
    try:
        text = json.loads((out / "config.json").read_text())["text_config"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    want = text_config()
    keys = (
        "vocab_size",
        "hidden_size",
        "hidden_size_per_layer_input",
        "num_hidden_layers",
        "num_kv_shared_layers",
    )
    return isinstance(text, dict) and all(text.get(k) == want[k] for k in keys)


def trained(state: dict[str, torch.Tensor], cfg: dict, seed: int, cache: Path | None) -> dict:
    """Train ``state``'s language model on the facts in place, or take the result from ``cache``.

    The cache holds, per training key, the trained language-model tensors and the training report;
    a lock keeps two builds of one key from training twice. Returns the report (as a dict).
    """
    from safetensors.torch import load_file, save_file

    from repack import train_tiny

    if cache is None:
        return train_tiny.train(cfg["text_config"], state, ON_GRID).as_dict()
    entry = cache / training_key(seed)
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        weights, report = entry / "lm.safetensors", entry / "report.json"
        if weights.is_file() and report.is_file():
            state.update(load_file(str(weights)))
            rep = json.loads(report.read_text())
            print(f"trained weights from the cache {entry}: {rep['line']}", file=sys.stderr)
            return rep
        rep = train_tiny.train(cfg["text_config"], state, ON_GRID).as_dict()
        lm = {k: v for k, v in state.items() if k.startswith(LM)}
        save_file(dict(sorted(lm.items())), str(entry / "lm.safetensors.tmp"), metadata={"format": "pt"})
        os.replace(entry / "lm.safetensors.tmp", weights)
        (entry / "report.json.tmp").write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")
        os.replace(entry / "report.json.tmp", report)
        return rep


def build(
    out: Path,
    seed: int,
    with_shared_kv: bool,
    force: bool,
    train: bool = True,
    cache: Path | str | None = "default",
) -> dict[str, int]:
    """Write the tiny checkpoint to ``out`` atomically; return counts for the summary.

    ``cache`` is where trained weights are kept by their inputs (``"default"``: default_cache();
    None: always train).
    """
    where = default_cache() if cache == "default" else (Path(cache) if cache is not None else None)
    with atomic_dir(out, force=force) as tmp:
        return _write(tmp, seed, with_shared_kv, train, where)


def _write(tmp: Path, seed: int, with_shared_kv: bool, train: bool, cache: Path | None) -> dict[str, int]:
    """Generate the tensors, tokenizer and configs into ``tmp``."""
    import torch
    from safetensors.torch import save_file

    from repack import grid, tokenizer

    cfg = full_config()
    state = random_state(cfg, seed)
    state.pop("lm_head.weight", None)  # tied to embed_tokens, as in the release
    gen = torch.Generator().manual_seed(seed)
    snapped = 0
    for name in sorted(state):
        if ON_GRID.match(name):
            # Embedding tables get larger steps so that scaled embeddings are not tiny.
            exp = -7 if "embed_tokens" in name else -10
            state[name] = grid.random_on_grid(tuple(state[name].shape), gen, exponent=exp)
            snapped += 1
    report = trained(state, cfg, seed, cache) if train else None
    if with_shared_kv:
        state.update(shared_kv_extras(state, gen))
    for name, t in state.items():
        if ON_GRID.match(name):
            rows, cols = t.shape
            if rows % 64 or cols % 128:
                raise AssertionError(f"{name} {list(t.shape)} does not satisfy Marlin")
    lm = {k: v for k, v in state.items() if k.startswith(LM)}
    towers = {k: v for k, v in state.items() if not k.startswith(LM)}
    shards = {"model-00001-of-00002.safetensors": lm, "model-00002-of-00002.safetensors": towers}
    weight_map = {}
    total = 0
    for fname, tensors in shards.items():
        save_file(dict(sorted(tensors.items())), str(tmp / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen_cfg = {
        "bos_token_id": 2,
        "do_sample": True,
        "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": 0,
        "temperature": 1.0,
        "top_k": 64,
        "top_p": 0.95,
    }
    (tmp / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    tokenizer.write(tmp, VOCAB, cfg["text_config"]["max_position_embeddings"])
    stamp = {
        "tool": "gemma-rig make_tiny_qat",
        "digest": inputs_digest(seed, with_shared_kv, train),
        "seed": seed,
        "with_shared_kv": with_shared_kv,
        "trained": train,
        "facts": len(tiny_facts.FACTS),
        "training": report,
    }
    (tmp / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return {"tensors": len(state), "on_grid": snapped, "bytes": total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="make_tiny_qat.py",
        description=(
            "Build a tiny Gemma 4 in the layout of Google's QAT release (no downloads), trained to "
            "answer the facts of repack/tiny_facts.py and ending exactly on the Q4_0 grid. Trained "
            "weights are cached by their inputs, so a second build does not train again."
        ),
        epilog=(
            "stdout says 'built' or, with --update and OUT already built from the same inputs, "
            "'unchanged'; progress and the training report go to stderr."
        ),
    )
    ap.add_argument("out", type=Path, help="output directory (must not exist unless --force or --update)")
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="random seed of the initial weights; same seed, same bytes (default 0)",
    )
    ap.add_argument(
        "--with-shared-kv",
        action="store_true",
        help="also write k_proj/v_proj/k_norm for the KV-shared layers (the QAT export omits them)",
    )
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    ap.add_argument(
        "--update",
        action="store_true",
        help="print 'unchanged' and write nothing when OUT records the same inputs; replace OUT "
        "when it holds a tiny build of other inputs (anything else in OUT still needs --force)",
    )
    ap.add_argument(
        "--untrained", action="store_true", help="skip training: the random model (seconds, answers noise)"
    )
    ap.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="where trained weights are kept by their inputs (default $GEMMA_RIG_TINY_CACHE, else "
        "$XDG_CACHE_HOME/gemma-rig/tiny)",
    )
    ap.add_argument(
        "--no-cache", action="store_true", help="train even if the cache holds the result, and keep nothing"
    )
    args = ap.parse_args(argv)
    train = not args.untrained

    def go() -> int:
        force = args.force
        if args.update and args.out.exists():
            recorded = recorded_digest(args.out)
            if recorded == inputs_digest(args.seed, args.with_shared_kv, train):
                print(f"{args.out} holds a build of the same inputs", file=sys.stderr)
                print("unchanged")
                return 0
            force = force or recorded is not None or older_tiny_build(args.out)
        cache = None if args.no_cache else (args.cache or default_cache())
        stats = build(args.out, args.seed, args.with_shared_kv, force, train=train, cache=cache)
        print(
            f"wrote {args.out}: {stats['tensors']} tensors ({stats['on_grid']} on the Q4_0 grid), "
            f"{stats['bytes'] / 1e6:.1f} MB",
            file=sys.stderr,
        )
        print("built")
        return 0

    from repack import cli  # here, so that importing build() stays light

    return cli.guarded("make_tiny_qat.py", go)


if __name__ == "__main__":
    sys.exit(main())
