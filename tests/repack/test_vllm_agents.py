"""The tiny model as an agent asks it, in vLLM 0.29.0's CPU build with the rig's agent flags
(inventory/group_vars/all/vllm.yml's ``rig_vllm_feature_flags``: the gemma4 tool-call and reasoning
parsers), through the official openai SDK: every tool question of repack/tiny_facts.py (TOOL_ASKS) gives a
parsed ``get_capital`` call with the right country, streamed or not; given the tool's result the model
answers in words; asked for JSON under a json_schema ``response_format`` it gives a closed object
that holds the fact.

emb4 is checked on test_vllm.py's own server start (``agent_misses`` there); w8a8, which re-quantizes,
gets one start here and must get 90% of the checks, misses listed.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from repack import make_tiny_qat, tiny_facts, tokenizer
from tests.conftest import ROOT
from tests.vllm_server import flag_argv, serve

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

FEATURES = yaml.safe_load((ROOT / "inventory" / "group_vars" / "all" / "vllm.yml").read_text())[
    "rig_vllm_feature_flags"
]
AGENT_FLAGS = [arg for flags in FEATURES.values() for arg in flag_argv(flags)]


def _create(client, name: str, **kw):
    return client.chat.completions.create(model=name, temperature=0, max_tokens=64, **kw)


def _streamed_call(client, name: str, messages: list[dict]) -> tuple[str, str]:
    """The one tool call of a streamed reply, put together from its pieces: (name, arguments)."""
    parts: dict[int, dict[str, str]] = {}
    for chunk in _create(client, name, messages=messages, tools=tiny_facts.TOOLS, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            slot = parts.setdefault(d.index, {"name": "", "arguments": ""})
            slot["name"] += (d.function.name or "") if d.function else ""
            slot["arguments"] += (d.function.arguments or "") if d.function else ""
    assert len(parts) == 1, parts
    return parts[0]["name"], parts[0]["arguments"]


def agent_misses(url: str, name: str) -> tuple[list[str], int]:
    """Every agent form asked of the server at ``url``: ('what -> got' for each miss, checks made)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    schema = {"type": "json_schema", "json_schema": {"name": "capital", "schema": tiny_facts.ANSWER_SCHEMA}}

    def ask_tool(country: str, capital: str) -> list[str]:
        out = []
        msgs = tiny_facts.messages(tiny_facts.tool_question(country))
        want = (tiny_facts.TOOL_NAME, {"country": country})
        r = _create(client, name, messages=msgs, tools=tiny_facts.TOOLS).choices[0]
        calls = r.message.tool_calls or []
        got = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
        if got != [want] or r.finish_reason != "tool_calls" or r.message.content:
            out.append(f"call {country} -> {got} {r.finish_reason} {r.message.content!r}")
        else:
            back = [*msgs, r.message.model_dump(exclude_none=True)]
            back.append({"role": "tool", "tool_call_id": calls[0].id, "content": capital})
            a = _create(client, name, messages=back, tools=tiny_facts.TOOLS).choices[0]
            if a.message.content != tiny_facts.reply(capital) or a.message.tool_calls:
                out.append(f"reply {country} -> {a.message.content!r} {a.message.tool_calls}")
        s_name, s_args = _streamed_call(client, name, msgs)
        if (s_name, json.loads(s_args or "null")) != want:
            out.append(f"streamed call {country} -> {s_name!r} {s_args!r}")
        return out

    def ask_json(fact: tiny_facts.Fact, country: str) -> list[str]:
        out = []
        msgs = tiny_facts.messages(tiny_facts.json_question(fact.question))
        j = _create(client, name, messages=msgs, response_format=schema).choices[0]
        try:
            obj = json.loads(j.message.content or "")
        except ValueError:
            obj = None
        if obj != {"country": country, "capital": fact.answer} or j.finish_reason != "stop":
            out.append(f"json {country} -> {j.message.content!r} {j.finish_reason}")
        # The plain question with the reasoning parser on: the answer is content, no reasoning.
        p = _create(client, name, messages=tiny_facts.messages(fact.question)).choices[0]
        if p.message.content != fact.answer or getattr(p.message, "reasoning", None):
            out.append(f"plain {country} -> {p.message.content!r} {getattr(p.message, 'reasoning', None)!r}")
        return out

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(lambda a: ask_tool(*a), tiny_facts.TOOL_ASKS))
        found += list(pool.map(lambda a: ask_json(*a), tiny_facts.JSON_FACTS))
    return [m for ms in found for m in ms], 3 * len(tiny_facts.TOOL_ASKS) + 2 * len(tiny_facts.JSON_FACTS)


def test_w8a8_serves_the_agent_forms(builds, tmp_path):
    flags = [*AGENT_FLAGS, "--language-model-only"]
    with serve(builds["w8a8"], "w8a8", tmp_path / "vllm.log", extra_args=flags) as url:
        misses, checks = agent_misses(url, "w8a8")
    print(f"w8a8: {checks - len(misses)}/{checks} agent checks; misses {misses}")
    assert len(misses) <= checks // 10, misses


def test_reasoning_and_calls_are_parsed_by_token_id_from_the_tiny_tokenizer(tmp_path):
    """vLLM's gemma4 parser on the tiny tokenizer: a thinking channel goes to ``reasoning`` and a
    call to ``tool_calls``, never into the content (the tokens exist, as single ids)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning.gemma4_engine_reasoning_parser import Gemma4ParserReasoningAdapter
    from vllm.tokenizers import get_tokenizer
    from vllm.tool_parsers.gemma4_engine_tool_parser import Gemma4EngineToolParser

    tokenizer.write(tmp_path, make_tiny_qat.VOCAB, 4096)
    tok = get_tokenizer(str(tmp_path))
    req = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "q"}], tools=tiny_facts.TOOLS
    )
    thought = "<|channel>thought\nThe tool knows.<channel|>Paris"
    reasoning, content = Gemma4ParserReasoningAdapter(tok).extract_reasoning(thought, req)
    assert (reasoning, content) == ("The tool knows.", "Paris")
    parsed = Gemma4EngineToolParser(tok).extract_tool_calls(tiny_facts.call_text("Peru"), req)
    assert parsed.tools_called and not parsed.content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls] == [
        (tiny_facts.TOOL_NAME, {"country": "Peru"})
    ]
