"""A small byte-level tokenizer with Gemma's special tokens, built locally (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

# id -> token; ids match the tiny model's config (pad 0, eos 1, bos 2, end_of_turn in eos list).
SPECIALS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<image_soft_token>",
    "<audio_soft_token>",
    "<start_of_image>",
    "<end_of_image>",
    "<start_of_audio>",
    "<end_of_audio>",
    "<video_soft_token>",
]
BYTE_OFFSET = 32  # byte tokens start here; ids between the specials and 32 are unused
TOKEN_IDS = {t: i for i, t in enumerate(SPECIALS)}

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def build(vocab_size: int) -> Tokenizer:
    """A byte-level BPE (no merges: every byte is a token) padded with unused tokens to ``vocab_size``."""
    byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
    byte_chars.sort()
    if BYTE_OFFSET + len(byte_chars) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is too small for {BYTE_OFFSET + len(byte_chars)} tokens")
    vocab: dict[str, int] = {}
    for i in range(BYTE_OFFSET):
        vocab[SPECIALS[i] if i < len(SPECIALS) else f"<unused{i}>"] = i
    for j, ch in enumerate(byte_chars):
        vocab[ch] = BYTE_OFFSET + j
    for i in range(BYTE_OFFSET + len(byte_chars), vocab_size):
        vocab[f"<unused{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t in vocab if t.startswith("<") and t.endswith(">") and len(t) > 1])
    return tok


def write(out: Path, vocab_size: int, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into ``out``."""
    build(vocab_size).save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}, indent=2) + "\n"
    )
