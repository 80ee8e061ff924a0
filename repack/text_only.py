#!/usr/bin/env python3
"""Drop the vision and audio towers: a multimodal Gemma 4 checkpoint -> a text-only one.

    python repack/text_only.py IN OUT

Tensors are renamed model.language_model.* -> model.* and the config is flattened to its
text_config with architectures [Gemma4ForCausalLM], so the result loads in vLLM and in
transformers. Shards whose tensors are all unchanged are hard-linked (copied across filesystems);
shards whose tensors are only renamed get a new header and a block copy of their data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repack import cli
from repack.steps import text_only

PROG = "text_only.py"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli.add_io(ap, "IN", "multimodal Gemma 4 checkpoint (QAT source or a repack)")
    args = ap.parse_args(argv)
    return cli.convert(PROG, args, [text_only])


if __name__ == "__main__":
    sys.exit(main())
