#!/usr/bin/env python3
"""clamp-check: the vllm service's ExecStartPre; exit 0 only when the Turing clamp is there once.

The check itself is ``turing_clamp.py`` (the module's module_utils, shipped byte-identical by
this role), installed in the same directory as this front end. The unit runs it as
``<venv>/bin/python -I clamp-check check --python <venv>/bin/python``: ``-I`` keeps the script's
own directory off ``sys.path``, so the sibling is put there explicitly (root-owned, mode 0755).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from turing_clamp import ClampError, check_file, locate


def main(argv: list[str] | None = None) -> int:
    """CLI: ``check [--python PY | --path FILE]``; exit 0 only when the clamp is there once."""
    parser = argparse.ArgumentParser(
        prog="clamp-check",
        description="Check that vLLM's Triton unified attention carries the gemma-rig Turing clamp "
        "exactly once (the vllm service's ExecStartPre).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check", help="exit 0 only when the clamp is present exactly once")
    where = chk.add_mutually_exclusive_group()
    where.add_argument(
        "--python", help="interpreter whose installed vLLM to check (default: the one running this)"
    )
    where.add_argument("--path", help="check this triton_unified_attention.py directly")
    args = parser.parse_args(argv)

    try:
        path = args.path or locate(args.python or sys.executable)
    except ClampError as exc:
        print(f"clamp-check: {exc}", file=sys.stderr)
        return 2
    ok, message = check_file(path)
    print(f"clamp-check: {message}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
