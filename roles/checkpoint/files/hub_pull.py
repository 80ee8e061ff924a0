#!/usr/bin/env python3
"""Pull a model snapshot from a Hugging Face-compatible hub into a local directory on the rig.

Run with the rig's venv Python (huggingface_hub comes with vLLM). The token comes on stdin
(--token-stdin) or from HF_TOKEN, the endpoint from HF_ENDPOINT; never from the command line, so
neither shows in process listings. The role passes the token on stdin: an environment set by
Ansible is written into the remote command string, which `ps` and -vvv show. A download that was
interrupted resumes: files already complete are skipped.
The revision is resolved to its commit first, and the snapshot is downloaded at that commit (a
branch that moves during the download cannot mix two commits); the commit is written into the
snapshot as HUB_SOURCE.json, so the manifest made from it records what was pulled.
Prints one JSON object: whether any file changed, how many files the snapshot holds, the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

# Written beside the model's files: a file of the checkpoint, so MANIFEST.sha256 lists it.
SOURCE_FILE = "HUB_SOURCE.json"
COMMIT = re.compile(r"[0-9a-f]{40}")


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
    parser.add_argument("--revision", required=True, help="a commit (or main, for an unpinned entry)")
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
        from huggingface_hub import HfApi, snapshot_download
    except ImportError as exc:
        print(f"hub_pull: huggingface_hub is not installed for {sys.executable}: {exc}", file=sys.stderr)
        return 2
    before = state(args.local_dir)
    args.local_dir.mkdir(parents=True, exist_ok=True)
    try:
        commit = HfApi().model_info(args.repo, revision=args.revision).sha
        # The hub answers with the commit; anything else is not one to pin or record.
        if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
            raise ValueError(f"the hub gave {str(commit)[:60]!r} as the commit of {args.revision[:60]!r}")
        if COMMIT.fullmatch(args.revision) and commit != args.revision:
            raise ValueError(f"asked for commit {args.revision}, the hub answered {commit}")
        snapshot_download(repo_id=args.repo, revision=commit, local_dir=str(args.local_dir))
        source = json.dumps({"repo": args.repo, "revision": args.revision, "commit": commit}, indent=1) + "\n"
        target = args.local_dir / SOURCE_FILE
        if not target.is_file() or target.read_text() != source:
            target.unlink(missing_ok=True)  # a file of that name from the hub: ours replaces it
            target.write_text(source)
    except Exception as exc:  # the hub client raises many types; report any of them plainly
        endpoint = os.environ.get("HF_ENDPOINT") or "the default hub"
        reason = f"{type(exc).__name__}: {exc}"
        if token:
            reason = reason.replace(token, "***")  # the role redacts too; never print it here
        print(f"hub_pull: cannot pull {args.repo}@{args.revision} from {endpoint}: {reason}", file=sys.stderr)
        return 1
    after = state(args.local_dir)
    print(json.dumps({"changed": before != after, "files": len(after), "commit": commit}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
