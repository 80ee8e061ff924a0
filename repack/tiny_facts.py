"""The facts the tiny model knows: one source for its training, its tests and the rig's checks.

Each fact is a short question with a one- or two-word answer. The tiny model (repack/make_tiny_qat.py)
is trained so that greedy decoding of a fact's chat prompt gives exactly the answer followed by
``<end_of_turn>``, and so that the fact's multiple-choice form gives the right letter.

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
    """A question and its exact answer (what greedy decoding must produce before ``<end_of_turn>``)."""

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
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()
