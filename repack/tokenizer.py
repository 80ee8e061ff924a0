"""A small byte-level tokenizer with Gemma's special tokens, built locally (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

# id -> token; ids match the tiny model's config (pad 0, eos 1, bos 2; <turn|> and <|tool_response>
# are in the eos list). The turn, tool and channel tokens are Gemma 4's own: vLLM's gemma4 tool and
# reasoning parsers find <|tool_call>, <tool_call|>, <|channel> and <channel|> by token id.
SPECIALS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<|turn>",
    "<turn|>",
    "<image_soft_token>",
    "<audio_soft_token>",
    "<start_of_image>",
    "<end_of_image>",
    "<start_of_audio>",
    "<end_of_audio>",
    "<video_soft_token>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|channel>",
    "<channel|>",
    "<|think|>",
]
BYTE_OFFSET = 32  # byte tokens start here; ids between the specials and 32 are unused
TOKEN_IDS = {t: i for i, t in enumerate(SPECIALS)}

# Gemma 4's chat template (the E2B/E4B form: no pre-closed thought channel), for text: a system turn
# holds <|think|> (enable_thinking), the system prompt and one <|tool>declaration:...<tool|> per
# tool; an assistant's tool calls are <|tool_call>call:NAME{key:value}<tool_call|>, the tool
# messages that follow are <|tool_response>response:NAME{...}<tool_response|> in the same model
# turn, and the model goes on in that turn. Strings are quoted with <|"|>, keys sorted. Tool
# parameters render their description, enum, nullable and type (the flat schemas agents send).
CHAT_TEMPLATE = (
    "{%- macro arg(v, quote_keys=true) -%}"
    "{%- if v is string -%}{{ '<|\"|>' + v + '<|\"|>' }}"
    "{%- elif v is boolean -%}{{ 'true' if v else 'false' }}"
    "{%- elif v is mapping -%}{{ '{' }}{%- for k, x in v | dictsort -%}"
    "{{ ',' if not loop.first }}{{ ('<|\"|>' + k + '<|\"|>') if quote_keys else k }}:{{ arg(x, quote_keys) }}"
    "{%- endfor -%}{{ '}' }}"
    "{%- elif v is iterable -%}{{ '[' }}{%- for x in v -%}{{ ',' if not loop.first }}{{ arg(x, quote_keys) }}"
    "{%- endfor -%}{{ ']' }}"
    "{%- else -%}{{ v }}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro declare(f) -%}"
    "{{ 'declaration:' + f['name'] + '{description:<|\"|>' + (f['description'] or '') + '<|\"|>' }}"
    "{%- set p = f['parameters'] -%}"
    "{%- if p -%}{{ ',parameters:{' }}"
    "{%- if p['properties'] -%}{{ 'properties:{' }}{%- for k, v in p['properties'] | dictsort -%}"
    "{{ ',' if not loop.first }}{{ k + ':{' }}{%- set c = namespace(on=false) -%}"
    "{%- if v['description'] -%}{{ 'description:<|\"|>' + v['description'] + '<|\"|>' }}{%- set c.on = true -%}"
    "{%- endif -%}"
    "{%- if v['enum'] -%}{{ ',' if c.on }}{{ 'enum:' + arg(v['enum']) }}{%- set c.on = true -%}{%- endif -%}"
    "{%- if v['nullable'] -%}{{ ',' if c.on }}{{ 'nullable:true' }}{%- set c.on = true -%}{%- endif -%}"
    "{{ ',' if c.on }}{{ 'type:<|\"|>' + v['type'] | upper + '<|\"|>}' }}"
    "{%- endfor -%}{{ '},' }}{%- endif -%}"
    "{%- if p['required'] -%}{{ 'required:' + arg(p['required']) + ',' }}{%- endif -%}"
    "{%- if p['type'] -%}{{ 'type:<|\"|>' + p['type'] | upper + '<|\"|>}' }}{%- endif -%}"
    "{%- endif -%}{{ '}' }}"
    "{%- endmacro -%}"
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable and content is not mapping -%}{%- for part in content -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro visible(t) -%}{%- set s = namespace(r='') -%}"
    "{%- for part in t.split('<channel|>') -%}{%- set s.r = s.r + part.split('<|channel>')[0] -%}{%- endfor -%}"
    "{{ s.r | trim }}"
    "{%- endmacro -%}"
    "{%- macro respond(name, body) -%}"
    "{{ '<|tool_response>response:' + name + '{' }}"
    "{%- if body is mapping -%}{%- for k, v in body | dictsort -%}"
    "{{ ',' if not loop.first }}{{ k }}:{{ arg(v, false) }}{%- endfor -%}"
    "{%- else -%}{{ 'value:' + arg(text(body), false) }}{%- endif -%}"
    "{{ '}<tool_response|>' }}"
    "{%- endmacro -%}"
    "{{ bos_token }}"
    "{%- set ns = namespace(prev=none, last=none) -%}"
    "{%- set loop_messages = messages -%}"
    "{%- if enable_thinking or tools or messages[0]['role'] in ['system', 'developer'] -%}"
    "{{ '<|turn>system\\n' }}"
    "{%- if enable_thinking -%}{{ '<|think|>\\n' }}{%- endif -%}"
    "{%- if messages[0]['role'] in ['system', 'developer'] -%}"
    "{{ text(messages[0]['content']) | trim }}{%- set loop_messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- for tool in tools or [] -%}{{ '<|tool>' + declare(tool['function']) + '<tool|>' }}{%- endfor -%}"
    "{{ '<turn|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] != 'tool' -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{%- if not (role == 'model' and ns.last == 'assistant') -%}{{ '<|turn>' + role + '\\n' }}{%- endif -%}"
    "{%- set ns.last = message['role'] -%}"
    "{%- set ns.prev = none -%}"
    "{%- set answered = namespace(on=false, scan=true) -%}"
    "{%- if message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set a = call['function']['arguments'] -%}"
    "{{ '<|tool_call>call:' + call['function']['name'] + '{' }}"
    "{%- if a is mapping -%}{%- for k, v in a | dictsort -%}"
    "{{ ',' if not loop.first }}{{ k }}:{{ arg(v, false) }}{%- endfor -%}"
    "{%- elif a is string -%}{{ a }}{%- endif -%}"
    "{{ '}<tool_call|>' }}"
    "{%- endfor -%}"
    "{%- set ns.prev = 'tool_call' -%}"
    "{%- for follow in loop_messages[loop.index0 + 1:] -%}"
    "{%- if follow['role'] != 'tool' -%}{%- set answered.scan = false -%}{%- endif -%}"
    "{%- if answered.scan -%}"
    "{%- set name = namespace(v=follow['name'] or 'unknown') -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- if call['id'] and call['id'] == follow['tool_call_id'] -%}{%- set name.v = call['function']['name'] -%}"
    "{%- endif -%}{%- endfor -%}"
    "{{ respond(name.v, follow['content']) }}"
    "{%- set answered.on = true -%}{%- set ns.prev = 'tool_response' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- if role == 'model' -%}{{ visible(text(message['content'])) }}"
    "{%- else -%}{{ text(message['content']) | trim }}{%- endif -%}"
    "{%- if ns.prev == 'tool_call' -%}{{ '<|tool_response>' }}"
    "{%- elif not (answered.on and not message['content']) -%}{{ '<turn|>\\n' }}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt and ns.prev not in ['tool_call', 'tool_response'] -%}"
    "{{ '<|turn>model\\n' }}{%- endif -%}"
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
