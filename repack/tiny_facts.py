"""The facts the tiny model knows: one source for its training, its tests and the rig's checks.

Each fact is a short question with a one- or two-word answer. The tiny model (repack/make_tiny_qat.py)
is trained so that greedy decoding of a fact's chat prompt gives exactly the answer followed by
``<turn|>``, and so that the fact's multiple-choice form gives the right letter.

An agent's forms are taught too, in Gemma 4's chat format: asked the capital of a country of
``TOOL_ASKS`` (ones it does not know) with the ``get_capital`` tool declared (``TOOLS``), the model
calls it (``call_text``); given the tool's result it answers in words (``reply``). Asked a fact of
``JSON_FACTS`` for JSON (``json_question``), it answers ``json_answer``.

Standard library only: the end-to-end tests, the accuracy tool and the Ansible smoke test import it
without torch.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

# (country, capital): one fact each, asked as "What is the capital of <country>?".
CAPITALS: tuple[tuple[str, str], ...] = (
    ("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"),
    ("Peru", "Lima"), ("Norway", "Oslo"), ("Greece", "Athens"), ("Ireland", "Dublin"),
    ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Portugal", "Lisbon"), ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"), ("Chile", "Santiago"), ("Cuba", "Havana"), ("India", "New Delhi"),
    ("China", "Beijing"), ("Russia", "Moscow"), ("Mexico", "Mexico City"), ("Brazil", "Brasilia"),
    ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("Belgium", "Brussels"),
    ("Denmark", "Copenhagen"), ("Hungary", "Budapest"), ("Thailand", "Bangkok"), ("Argentina", "Buenos Aires"),
)  # fmt: skip

LETTERS = "ABCD"


@dataclass(frozen=True)
class Fact:
    """A question and its exact answer (what greedy decoding must produce before ``<turn|>``)."""

    question: str
    answer: str


@dataclass(frozen=True)
class Choice:
    """A fact asked as multiple choice: the prompt lists four lettered options; ``letter`` is right."""

    fact: Fact
    options: tuple[str, str, str, str]
    letter: str

    @property
    def prompt(self) -> str:
        """The question, then one option a line ("A. Paris")."""
        return "\n".join(
            [self.fact.question, *(f"{k}. {o}" for k, o in zip(LETTERS, self.options, strict=True))]
        )


FACTS: tuple[Fact, ...] = tuple(Fact(f"What is the capital of {c}?", a) for c, a in CAPITALS)

# The rig's smoke test asks this one and expects SMOKE.answer ("Paris") in the reply.
SMOKE: Fact = FACTS[0]
SMOKE_QUESTION: str = SMOKE.question
SMOKE_ANSWER: str = SMOKE.answer


def messages(question: str) -> list[dict[str, str]]:
    """The chat messages that ask ``question`` (a single user turn, as the model was trained)."""
    return [{"role": "user", "content": question}]


# (country, capital) that the model does not know and asks the tool about: a known fact's
# question would have to give the answer without tools and a call with them, from one question.
TOOL_ASKS: tuple[tuple[str, str], ...] = (
    ("Australia", "Canberra"), ("Nigeria", "Abuja"), ("Vietnam", "Hanoi"), ("Colombia", "Bogota"),
)  # fmt: skip
# (fact, its country) for every eighth fact: the ones also taught as JSON answers.
JSON_FACTS: tuple[tuple[Fact, str], ...] = tuple((FACTS[i], CAPITALS[i][0]) for i in range(0, len(FACTS), 8))

# The tool the model learned, exactly as an OpenAI-style client declares it (the chat template
# renders this declaration into the prompt; another wording is another prompt).
TOOL_NAME = "get_capital"
GET_CAPITAL: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "The capital city of a country.",
        "parameters": {
            "type": "object",
            "properties": {"country": {"type": "string"}},
            "required": ["country"],
        },
    },
}
TOOLS: list[dict] = [GET_CAPITAL]

# The JSON answer's schema: the keys in this order, as a json_schema response_format sends it.
ANSWER_SCHEMA: dict = {
    "type": "object",
    "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
    "required": ["country", "capital"],
    "additionalProperties": False,
}


def call_text(country: str) -> str:
    """What the model emits to call the tool: Gemma 4's tool-call syntax, before ``<|tool_response>``."""
    return f'<|tool_call>call:{TOOL_NAME}{{country:<|"|>{country}<|"|>}}<tool_call|>'


def tool_question(country: str) -> str:
    """What a ``TOOL_ASKS`` country is asked."""
    return f"What is the capital of {country}?"


def tool_messages(question: str, country: str, capital: str) -> list[dict]:
    """The question, the model's call and the tool's result, as an OpenAI-style client sends them back."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": {"country": country}},
    }
    return [
        *messages(question),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": capital},
    ]


def reply(capital: str) -> str:
    """The model's answer in words once the tool has answered."""
    return f"It is {capital}."


def json_question(question: str) -> str:
    """The question asked for a JSON answer (what a json_schema request sends as its user turn)."""
    return f"{question} Answer in JSON."


def json_answer(country: str, capital: str) -> str:
    """The JSON object the model answers ``json_question`` with (``ANSWER_SCHEMA``'s keys, in order)."""
    return json.dumps({"country": country, "capital": capital}, separators=(",", ":"))


def choice(index: int, facts: tuple[Fact, ...] | None = None) -> Choice:
    """The multiple-choice form of ``facts[index]``.

    The three distractors are other facts' answers, drawn and ordered by a generator seeded by the
    index alone, so the form never changes between runs or machines; the right answer goes at
    position ``index % 4``, so every letter is right equally often.
    """
    facts = FACTS if facts is None else facts
    fact = facts[index]
    rng = random.Random(f"tiny-facts:{index}")  # str seeds hash with sha512: stable everywhere
    others = sorted({f.answer for f in facts} - {fact.answer})
    options = rng.sample(others, 3)
    options.insert(index % len(LETTERS), fact.answer)
    return Choice(fact, (options[0], options[1], options[2], options[3]), LETTERS[index % len(LETTERS)])


def choices(facts: tuple[Fact, ...] | None = None) -> list[Choice]:
    """Every fact's multiple-choice form, in the facts' order (``FACTS`` when None)."""
    facts = FACTS if facts is None else facts
    return [choice(i, facts) for i in range(len(facts))]


def digest(facts: tuple[Fact, ...] | None = None) -> str:
    """sha256 of the facts and their multiple-choice forms: part of the tiny model's cache key."""
    facts = FACTS if facts is None else facts
    doc = [[f.question, f.answer] for f in facts] + [[c.prompt, c.letter] for c in choices(facts)]
    doc += [[TOOLS, ANSWER_SCHEMA, TOOL_ASKS, [[f.question, f.answer, c] for f, c in JSON_FACTS]]]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()
