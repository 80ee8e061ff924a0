"""What an agent asks of an endpoint, with the official openai SDK: the checks the direct rig
(test_05_rig_contract) and the gateway (test_27_agents) share. The tool, its examples, the JSON
schema and the answers are the tiny model's fact set (repack/tiny_facts.py)."""

from __future__ import annotations

import json

import jsonschema
import openai

from repack import tiny_facts

# The parsers' delimiters (vLLM's gemma4 parser): none may reach an answer's content.
MARKUP = ("<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", '<|"|>', "<turn|>")


def _sent_back(messages: list[dict]) -> list[dict]:
    """A tool conversation as the SDK sends it: a call's arguments are JSON text."""
    out = []
    for message in messages:
        calls = [
            {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
            for c in message.get("tool_calls") or []
        ]
        out.append({**message, "tool_calls": calls} if calls else message)
    return out


def _clean(content: str | None) -> str:
    assert content is not None and not [m for m in MARKUP if m in content], content
    return content


def assert_calls_the_tool(client: openai.OpenAI, model: str, examples=tiny_facts.AGENT) -> None:
    """Each example's question, with the tool declared, answers with one parsed call of it with
    the example's country, and no text."""
    for fact, country in examples:
        reply = client.chat.completions.create(
            model=model, messages=tiny_facts.messages(fact.question), tools=tiny_facts.TOOLS, temperature=0
        )
        choice = reply.choices[0]
        calls = choice.message.tool_calls or []
        assert choice.finish_reason == "tool_calls" and len(calls) == 1, (fact.question, choice)
        assert calls[0].function.name == tiny_facts.TOOL_NAME, (fact.question, calls)
        assert json.loads(calls[0].function.arguments) == {"country": country}, (fact.question, calls)
        assert not (choice.message.content or "").strip(), choice.message.content


def assert_answers_the_tools_result(client: openai.OpenAI, model: str) -> None:
    """Given the tool's result, the model answers in words (no second call)."""
    fact, country = tiny_facts.AGENT[0]
    messages = _sent_back(tiny_facts.tool_messages(fact.question, country, fact.answer))
    reply = client.chat.completions.create(
        model=model, messages=messages, tools=tiny_facts.TOOLS, temperature=0
    )
    message = reply.choices[0].message
    assert not message.tool_calls, message
    assert _clean(message.content).strip() == tiny_facts.reply(country, fact.answer)


def assert_streamed_call_is_the_same(client: openai.OpenAI, model: str) -> None:
    """A streamed tool call, put together from its deltas by index, is the call the whole answer holds."""
    fact, country = tiny_facts.AGENT[-1]
    calls: dict[int, dict[str, str]] = {}
    pieces = 0
    stream = client.chat.completions.create(
        model=model,
        messages=tiny_facts.messages(fact.question),
        tools=tiny_facts.TOOLS,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        for choice in chunk.choices:
            for part in choice.delta.tool_calls or []:
                pieces += 1
                call = calls.setdefault(part.index, {"name": "", "arguments": ""})
                call["name"] += (part.function and part.function.name) or ""
                call["arguments"] += (part.function and part.function.arguments) or ""
    assert pieces >= 1 and list(calls) == [0], calls
    assert calls[0]["name"] == tiny_facts.TOOL_NAME
    assert json.loads(calls[0]["arguments"]) == {"country": country}


def assert_json_schema_answer(client: openai.OpenAI, model: str) -> None:
    """A json_schema response_format: the answer parses and validates against the schema."""
    fact, country = tiny_facts.AGENT[1]
    reply = client.chat.completions.create(
        model=model,
        messages=tiny_facts.messages(tiny_facts.json_question(fact.question)),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "capital", "schema": tiny_facts.ANSWER_SCHEMA, "strict": True},
        },
        temperature=0,
    )
    doc = json.loads(_clean(reply.choices[0].message.content))
    jsonschema.validate(doc, tiny_facts.ANSWER_SCHEMA)
    assert doc == {"country": country, "capital": fact.answer}


def assert_reasoning_apart(client: openai.OpenAI, model: str) -> None:
    """With the reasoning parser on, an answer's text is content; whatever reasoning came is in its
    own field, and no channel markup is left in either."""
    fact = tiny_facts.FACTS[0]
    reply = client.chat.completions.create(
        model=model, messages=tiny_facts.messages(fact.question), temperature=0
    )
    message = reply.choices[0].message
    assert _clean(message.content).strip() == fact.answer
    reasoning = getattr(message, "reasoning", None) or getattr(message, "reasoning_content", None) or ""
    assert not [m for m in MARKUP if m in reasoning], reasoning


def assert_agent_endpoint(client: openai.OpenAI, model: str, examples=tiny_facts.AGENT) -> None:
    """Every check above, in one call."""
    assert_calls_the_tool(client, model, examples)
    assert_answers_the_tools_result(client, model)
    assert_streamed_call_is_the_same(client, model)
    assert_json_schema_answer(client, model)
    assert_reasoning_apart(client, model)
