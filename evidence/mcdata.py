"""Write evidence/data/mc-small.jsonl: a small, deterministic multiple-choice set the project owns.

Simple arithmetic, capitals, opposites and ordering questions, four choices each, the label's
position shuffled with a fixed seed. It exists to exercise the paired comparison end to end (the
tiny test models answer near chance); a real accuracy claim needs a real suite passed to
``--data``. ``python -m evidence.mcdata`` rewrites the file; a test checks it is current.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from evidence import EVIDENCE_DIR

DEFAULT_OUT = EVIDENCE_DIR / "data" / "mc-small.jsonl"

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


def main(argv: list[str] | None = None) -> int:
    """CLI: write the JSONL."""
    ap = argparse.ArgumentParser(prog="python -m evidence.mcdata", description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in generate()))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
