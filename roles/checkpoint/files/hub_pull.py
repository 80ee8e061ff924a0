#!/usr/bin/env python3
"""Pull a model snapshot from a Hugging Face-compatible hub into a local directory on the rig.

Run with the rig's venv Python (huggingface_hub comes with vLLM). The token comes on stdin
(--token-stdin) or from HF_TOKEN, the endpoint from HF_ENDPOINT; never from the command line, so
neither shows in process listings. The role passes the token on stdin: an environment set by
Ansible is written into the remote command string, which `ps` and -vvv show. A download that was
interrupted resumes: files already complete are skipped.
Prints one JSON object: whether any file changed, and how many files the snapshot holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def state(root: Path) -> dict[str, tuple[int, int]]:
    """(size, inode) of every non-hidden file: a download that replaced a file changes its inode."""
    found = {}
    if root.is_dir():
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if path.is_file() and not any(part.startswith(".") for part in rel.parts):
                st = path.stat()
                found[str(rel)] = (st.st_size, st.st_ino)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repo", required=True, help="hub id, for example google/gemma-4-E2B-it")
    parser.add_argument("--revision", default="main", help="branch, tag or commit")
    parser.add_argument("--local-dir", required=True, type=Path, help="where the snapshot lives")
    parser.add_argument(
        "--token-stdin", action="store_true", help="read the token from stdin (empty: no token)"
    )
    args = parser.parse_args(argv)
    token = sys.stdin.read().strip() if args.token_stdin else ""
    if token:
        # This process's environment only: huggingface_hub reads HF_TOKEN wherever it needs it,
        # and nothing of it reaches /proc/<pid>/cmdline.
        os.environ["HF_TOKEN"] = token

    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        print(f"hub_pull: huggingface_hub is not installed for {sys.executable}: {exc}", file=sys.stderr)
        return 2
    before = state(args.local_dir)
    args.local_dir.mkdir(parents=True, exist_ok=True)
    try:
        snapshot_download(repo_id=args.repo, revision=args.revision, local_dir=str(args.local_dir))
    except Exception as exc:  # the hub client raises many types; report any of them plainly
        endpoint = os.environ.get("HF_ENDPOINT") or "the default hub"
        reason = f"{type(exc).__name__}: {exc}"
        if token:
            reason = reason.replace(token, "***")  # the role redacts too; never print it here
        print(f"hub_pull: cannot pull {args.repo}@{args.revision} from {endpoint}: {reason}", file=sys.stderr)
        return 1
    after = state(args.local_dir)
    print(json.dumps({"changed": before != after, "files": len(after)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
