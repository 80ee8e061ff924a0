"""Build a tiny random Gemma 4 text model with its own byte-level tokenizer (tests only, no downloads).

The repack package builds the rig's real tiny checkpoints; this exists so the evidence tests can
start vLLM's CPU build on two *different* small builds of the same architecture without depending
on it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
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


@contextlib.contextmanager
def serve(model: Path, name: str, port: int, log: Path, timeout: float = 600.0) -> Iterator[str]:
    """Run vLLM's CPU build from this interpreter on ``model``, the local rig's way; yield its URL.

    The flags are the local platform's (inventory/group_vars/local.yml): eager, an explicit KV cache
    size, no prefix cache so benchmark repeats cannot hit it. The log goes to ``log`` so tests can
    read the real start-up lines.
    """
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
        "--max-model-len", "2048", "--max-num-seqs", "4", "--kv-cache-memory-bytes", "268435456",
        "--enforce-eager", "--no-enable-prefix-caching",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM not ready after {timeout:.0f} s; see {log}") from None
                time.sleep(2)
        yield url
    finally:
        # The server's whole process group: the API server, its engine core and worker.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    """CLI: ``python -m evidence._tiny OUT --seed N``."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(build(args.out, args.seed))


if __name__ == "__main__":
    main()
