#!/usr/bin/env python3
"""Google's Gemma 4 QAT release -> text-only int8 W8A8 (compressed-tensors int-quantized).

    python repack/w8a8_from_qat.py SRC OUT

Weights: int8, one scale per output channel (amax / 127 of each row of the QAT values).
Activations: int8, dynamic, per token. Towers dropped; embeddings stay bf16.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repack import cli
from repack.steps import STEPS

PROG = "w8a8_from_qat.py"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli.add_io(ap)
    args = ap.parse_args(argv)
    return cli.convert(PROG, args, STEPS["w8a8"])


if __name__ == "__main__":
    sys.exit(main())
