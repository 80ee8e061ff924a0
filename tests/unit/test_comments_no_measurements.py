"""Comments and docstrings in product code give reasons, not measurements.

A figure measured once (a start that took 308 s, a loop 20x slower) goes stale where it is
written again beside the code; the measured figures live in docs/ (measurements.md, facts.md,
tpu.md), and a comment points there. A figure that is a setting or a budget ("at most 30 s a
wait", "must stay under 90 s") is not a measurement: what marks one is a figure beside a word
that reports an observation.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["roles", "playbooks", "inventory", "library", "module_utils", "plugins", "rig_mcp", "repack",
           "scripts", "site.yml", "swap.yml", "gateway.yml", "teardown.yml"]  # fmt: skip
_FIGURE = (
    r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:ms|s|sec|seconds|min|minutes|hours|tok/s|GiB|MiB)\b"
)
_OBSERVED = r"\b(?:measured|took|spent|against|about|was|were|off every|of every)\b|~|->"
MEASUREMENT = re.compile(
    rf"(?:{_FIGURE}).*(?:{_OBSERVED})|(?:{_OBSERVED}).*(?:{_FIGURE})|\b\d+(?:\.\d+)?x (?:slower|faster)\b",
    re.IGNORECASE,
)
TEXT_SUFFIXES = (".yml", ".yaml", ".j2", ".sh", ".cfg", ".conf", ".toml")


def _python_prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every comment and triple-quoted string of a Python source."""
    out: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        is_block = tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").startswith(('"""', "'''"))
        if tok.type == tokenize.COMMENT or is_block:
            out += [(tok.start[0] + i, line) for i, line in enumerate(tok.string.splitlines())]
    return out


def _hash_comments(text: str) -> list[tuple[int, str]]:
    """(line number, comment part) of every line with a # comment (YAML, Jinja, shell, config)."""
    return [(n, line[line.index("#") :]) for n, line in enumerate(text.splitlines(), 1) if "#" in line]


def measurements_in(path: str, text: str) -> list[str]:
    """Every comment or docstring line of one file that reports a measurement, as PATH:LINE: TEXT."""
    if path.endswith(".py"):
        prose = _python_prose(text)
    elif path.endswith(TEXT_SUFFIXES) or "." not in Path(path).name:
        prose = _hash_comments(text)
    else:
        return []
    return [f"{path}:{n}: {line.strip()}" for n, line in prose if MEASUREMENT.search(line)]


def test_product_comments_carry_no_measurements() -> None:
    files = subprocess.run(
        ["git", "ls-files", *PRODUCT], cwd=ROOT, capture_output=True, text=True, check=True
    )
    hits: list[str] = []
    for rel in files.stdout.split():
        path = ROOT / rel
        if path.is_file() and not path.is_symlink():
            hits += measurements_in(rel, path.read_text(encoding="utf-8", errors="replace"))
    assert hits == [], "move the figure to docs/ and point there:\n" + "\n".join(hits)


def test_the_rule_tells_a_measurement_from_a_setting() -> None:
    measured = [
        "# compiles for minutes (308 s measured, 857 s for bf16 without a cache)",
        "# eager mode (~30 s to healthy)",
        "# a warm bf16 start took 497 s against 857 s cold",
        "# 10-15 s off every start on 2 cores",
        "# kept LLVM from vectorizing (measured 20x slower on the same loop)",
        "# its import alone was 1-3 s of every run",
        "# a whole chunk 27.5 -> 21.5 ms",
    ]
    settings = [
        "# Exponential backoff within deadline seconds (x2, at most 30 s a wait)",
        "# the whole build must stay under 90 s on two CPU cores",
        "# instead of retrying forever",
        "# 4h, 90m, 3600s or a bare number of seconds",
    ]
    assert [line for line in measured if not measurements_in("x.yml", line)] == []
    assert [line for line in settings if measurements_in("x.yml", line)] == []
    assert measurements_in("x.py", '"""Doc."""\nX = 1  # took 3 s\n') == ["x.py:2: # took 3 s"]
    assert measurements_in("x.py", 'S = "took 3 s"\n') == []  # a string that is data, not prose
