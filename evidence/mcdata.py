"""Write the accuracy role's data sets, mc-small.jsonl and tiny-facts-mc.jsonl: multiple-choice sets the
project owns (roles/accuracy/files/data, which the role copies to the rig beside its scorer).

Simple arithmetic, capitals, opposites and ordering questions, four choices each, the label's
position shuffled with a fixed seed. It exists to exercise the paired comparison end to end (the
tiny test models answer near chance); a real accuracy claim needs a real suite passed to
``--data``. tiny-facts-mc.jsonl asks the tiny model's own facts (repack/tiny_facts.py), which
the trained tiny model answers, in its chat template. ``python -m evidence.mcdata`` rewrites both
files; a test checks they are current.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from evidence import EVIDENCE_DIR

DATA_DIR = EVIDENCE_DIR.parent / "roles" / "accuracy" / "files" / "data"

DEFAULT_OUT = DATA_DIR / "mc-small.jsonl"
# The tiny model's facts (repack/tiny_facts.py) as lettered multiple choice in its chat template.
TINY_FACTS_OUT = DATA_DIR / "tiny-facts-mc.jsonl"

CAPITALS = [
    ("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
    ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"),
    ("Greece", "Athens"), ("Ireland", "Dublin"), ("Austria", "Vienna"), ("Poland", "Warsaw"),
    ("Portugal", "Lisbon"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Chile", "Santiago"),
]  # fmt: skip
OPPOSITES = [
    ("hot", "cold"), ("up", "down"), ("day", "night"), ("open", "closed"), ("fast", "slow"), ("big", "small"),
    ("early", "late"), ("full", "empty"), ("light", "dark"), ("wet", "dry"), ("high", "low"), ("old", "new"),
]  # fmt: skip
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _record(rng: random.Random, question: str, answer: str, distractors: list[str]) -> dict:
    wrong = rng.sample(sorted(set(distractors) - {answer}), 3)
    choices = [answer, *wrong]
    rng.shuffle(choices)
    return {"question": question, "choices": choices, "label": choices.index(answer)}


def generate(seed: int = 7) -> list[dict]:
    """The records, in a fixed order."""
    rng = random.Random(seed)
    records = []
    for _ in range(40):
        x, y = rng.randrange(2, 50), rng.randrange(2, 50)
        near = [str(x + y + d) for d in (-10, -2, -1, 1, 2, 10) if x + y + d > 0]
        records.append(_record(rng, f"What is {x} + {y}?", str(x + y), near))
    cities = [c for _, c in CAPITALS]
    for country, city in CAPITALS:
        records.append(_record(rng, f"What is the capital of {country}?", city, cities))
    words = [w for pair in OPPOSITES for w in pair]
    for a, b in OPPOSITES:
        records.append(_record(rng, f"What is the opposite of {a}?", b, [w for w in words if w != a]))
    for _ in range(20):
        n = rng.randrange(0, 10)
        records.append(
            _record(rng, f"Which number comes after {NUMBER_WORDS[n]}?", NUMBER_WORDS[n + 1], NUMBER_WORDS)
        )
    return records


def generate_tiny_facts() -> list[dict]:
    """The tiny model's fact set as lettered multiple choice, in the form it was trained on.

    Each record's ``prompt`` is the question and its four options through the tiny model's own
    chat template (repack/tokenizer.py), up to the model's turn; the choices are the letters, so
    the accuracy tool scores the letter the model would write. ``question`` names the fact.
    """
    import jinja2

    from repack import tiny_facts, tokenizer

    template = jinja2.Environment(autoescape=False).from_string(tokenizer.CHAT_TEMPLATE)
    return [
        {
            "question": c.fact.question,
            "prompt": template.render(
                messages=tiny_facts.messages(c.prompt), bos_token="<bos>", add_generation_prompt=True
            ),
            "choices": list(tiny_facts.LETTERS),
            "label": tiny_facts.LETTERS.index(c.letter),
        }
        for c in tiny_facts.choices()
    ]


# Every data file this module writes: its default path and its records.
DATA_FILES = {DEFAULT_OUT: generate, TINY_FACTS_OUT: generate_tiny_facts}


def main(argv: list[str] | None = None) -> int:
    """CLI: write the JSONL files (or one, with --out and --set)."""
    ap = argparse.ArgumentParser(prog="python -m evidence.mcdata", description=__doc__)
    ap.add_argument("--set", choices=["mc-small", "tiny-facts"], help="write only this set (default: both)")
    ap.add_argument("--out", type=Path, help="where to write --set (default: its file in the accuracy role)")
    args = ap.parse_args(argv)
    if args.out and not args.set:
        ap.error("--out needs --set")
    wanted = dict(DATA_FILES)
    if args.set:
        default = DEFAULT_OUT if args.set == "mc-small" else TINY_FACTS_OUT
        wanted = {args.out or default: wanted[default]}
    for out, make in wanted.items():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in make()))
        print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
