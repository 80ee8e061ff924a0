"""Regenerate the golden files: render every case and write it over tests/golden/<case>/.

Run by hand after a deliberate change, from the repository root, then review the diff:

    .venv/bin/python -m tests.golden.update
    git diff tests/golden

The golden test never runs this: it only compares (tests/unit/test_rendered_golden.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.golden.render import CASES, FILES, GOLDEN, render


def main() -> int:
    """Render into a scratch directory, copy each file over its golden one, say which changed."""
    with tempfile.TemporaryDirectory(prefix="golden-") as scratch:
        out = Path(scratch)
        render(out)
        for case in CASES:
            for name in FILES:
                got = (out / case / name).read_bytes()
                golden = GOLDEN / case / name
                if golden.exists() and golden.read_bytes() == got:
                    continue
                golden.parent.mkdir(parents=True, exist_ok=True)
                golden.write_bytes(got)
                print(f"wrote {golden.relative_to(GOLDEN.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
