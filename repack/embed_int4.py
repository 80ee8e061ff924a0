#!/usr/bin/env python3
"""The per-layer embedding table (and with --embed-tokens, embed_tokens and lm_head) -> int4 group 32.

    python repack/embed_int4.py IN OUT [--embed-tokens]

With --embed-tokens the LM head is written explicitly (lm_head.*, the same int4 values as
embed_tokens) and tie_word_embeddings is set to false: vLLM cannot tie an int4 embedding.
The grid is recovered, not re-quantized; off-grid groups abort the run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repack import cli
from repack.steps import embed_int4

PROG = "embed_int4.py"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli.add_io(ap, "IN", "Gemma 4 checkpoint with bf16 embedding tables (usually text_only.py's output)")
    ap.add_argument(
        "--embed-tokens", action="store_true", help="also embed_tokens, plus an explicit, untied int4 lm_head"
    )
    args = ap.parse_args(argv)
    return cli.convert(PROG, args, [embed_int4(args.embed_tokens)])


if __name__ == "__main__":
    sys.exit(main())
