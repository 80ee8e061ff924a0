"""What an agent asks of an endpoint, with the official openai SDK: the checks the direct rig
(test_05_rig_contract) and the gateway (test_25_gateway) share. The tool, its examples (TOOL_ASKS),
the JSON schema and the answers are the tiny model's fact set (repack/tiny_facts.py)."""

from __future__ import annotations

import json

import jsonschema
import openai

from repack import tiny_facts

# The parsers' delimiters (vLLM's gemma4 parser): none may reach an answer's content.
MARKUP = ("<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", '<|"|>', "<turn|>")


def _clean(content: str | None) -> str:
    assert content is not None and not [m for m in MARKUP if m in content], content
    return content


def _call(client: openai.OpenAI, model: str, country: str):
    """The question about ``country`` with the tool declared: the reply's choice, checked to be one
    parsed call of the tool with that country and no text."""
    question = tiny_facts.tool_question(country)
    choice = client.chat.completions.create(
        model=model, messages=tiny_facts.messages(question), tools=tiny_facts.TOOLS, temperature=0
    ).choices[0]
    calls = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and len(calls) == 1, (question, choice)
    assert calls[0].function.name == tiny_facts.TOOL_NAME, (question, calls)
    assert json.loads(calls[0].function.arguments) == {"country": country}, (question, calls)
    assert not (choice.message.content or "").strip(), choice.message.content
    return choice


def assert_calls_the_tool(client: openai.OpenAI, model: str, asks=tiny_facts.TOOL_ASKS) -> None:
    """Each tool example's question, with the tool declared, answers with one parsed call of it."""
    for country, _ in asks:
        _call(client, model, country)


def assert_answers_the_tools_result(client: openai.OpenAI, model: str) -> None:
    """The call sent back as the SDK returned it, with the tool's result: the model answers in
    words (no second call)."""
    country, capital = tiny_facts.TOOL_ASKS[0]
    choice = _call(client, model, country)
    messages = [
        *tiny_facts.messages(tiny_facts.tool_question(country)),
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": capital},
    ]
    reply = client.chat.completions.create(
        model=model, messages=messages, tools=tiny_facts.TOOLS, temperature=0
    )
    message = reply.choices[0].message
    assert not message.tool_calls, message
    assert _clean(message.content).strip() == tiny_facts.reply(capital)


def assert_streamed_call_is_the_same(client: openai.OpenAI, model: str) -> None:
    """A streamed tool call, put together from its deltas by index, is the call the whole answer holds."""
    country, _ = tiny_facts.TOOL_ASKS[-1]
    whole = _call(client, model, country).message.tool_calls[0].function
    calls: dict[int, dict[str, str]] = {}
    stream = client.chat.completions.create(
        model=model,
        messages=tiny_facts.messages(tiny_facts.tool_question(country)),
        tools=tiny_facts.TOOLS,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        for choice in chunk.choices:
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, {"name": "", "arguments": ""})
                call["name"] += (part.function and part.function.name) or ""
                call["arguments"] += (part.function and part.function.arguments) or ""
    assert list(calls) == [0], calls
    assert calls[0]["name"] == whole.name
    assert json.loads(calls[0]["arguments"]) == json.loads(whole.arguments)


def assert_json_schema_answer(client: openai.OpenAI, model: str) -> None:
    """A json_schema response_format: the answer parses and validates against the schema."""
    fact, country = tiny_facts.JSON_FACTS[0]
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


def assert_agent_endpoint(client: openai.OpenAI, model: str) -> None:
    """Every check above, in one call."""
    assert_calls_the_tool(client, model)
    assert_answers_the_tools_result(client, model)
    assert_streamed_call_is_the_same(client, model)
    assert_json_schema_answer(client, model)
    assert_reasoning_apart(client, model)
