"""Build a tiny random Gemma 4 text model whose greedy output is text (tests only, no downloads).

The rig's tiny model (repack/make_tiny_qat.py) serves everywhere else, but its tokenizer reserves a
third of its 384 ids for Gemma's special and unused tokens, and at temperature 0 its random weights
emit those (measured: `<unused348>` x16, streamed as empty text). the bench client (roles/bench/files/bench.py) times the first
token by the first non-empty text, so on that model every cell reads "no tokens streamed".
tests/controller/test_bench.py therefore benchmarks this model, whose BPE vocabulary has 4 special tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Water boils at one hundred degrees. "
    "Question: Answer: A B C D yes no true false red green blue one two three four five "
    "Paris London Rome Berlin cat dog bird fish sun moon star tree river mountain city."
)


def build_tokenizer(out: Path, vocab_size: int = 384) -> None:
    """Train a byte-level BPE tokenizer on a fixed corpus and save it as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )
    fast.save_pretrained(out)


def build(out: Path, seed: int, layers: int = 4) -> Path:
    """Write a random tiny Gemma4ForCausalLM (bf16 safetensors, own tokenizer) to ``out``."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(seed)
    types = ["full_attention" if i % 2 == 1 else "sliding_attention" for i in range(layers)]
    cfg = Gemma4TextConfig(
        vocab_size=max(vocab, 512),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=64,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=max(vocab, 512),
        layer_types=types,
        sliding_window=64,
        max_position_embeddings=8192,
        num_kv_shared_layers=0,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        final_logit_softcapping=30.0,
    )
    model = Gemma4ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


def main() -> None:
    """CLI: ``python -m evidence._tiny OUT --seed N``."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(build(args.out, args.seed))


if __name__ == "__main__":
    main()
