#!/usr/bin/env python3
"""Write a hashed requirements file for a rig's vLLM install, resolved for the rig's platform.

pip's own resolver runs on the controller for the rig's Python and platform (`pip install
--dry-run --report`: metadata only, no big wheel is downloaded), and every distribution it picks is
written `name==version --hash=sha256:...` from the report's download_info. The vllm role installs
from that file with `--require-hashes`, so the rig gets exactly what was resolved here, byte for byte.

    make_lock.py gce.txt vllm==0.29.0 --python-version 3.13 --glibc 2.41
    make_lock.py tpu.txt vllm-tpu==0.29.0 tpu-inference==0.29.0 --python-version 3.12 --glibc 2.35
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def platforms(glibc: str, arch: str) -> list[str]:
    """Every manylinux tag a glibc of this version runs: pip does not expand a --platform itself."""
    major, minor = (int(p) for p in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    return [*tags, f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", "any"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the requirements file to write")
    ap.add_argument("requirements", nargs="+", help="what the role installs, pinned (name==version)")
    ap.add_argument("--python-version", required=True, help="the rig's CPython, such as 3.13")
    ap.add_argument("--glibc", required=True, help="the rig's glibc, such as 2.41 (Debian 13)")
    ap.add_argument("--arch", default="x86_64")
    ap.add_argument("--index-url", default="https://pypi.org/simple")
    ap.add_argument("--extra-index-url", action="append", default=[])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
               "--quiet", "--report", str(report), "--only-binary=:all:", "--implementation", "cp",
               "--python-version", args.python_version, "--target", str(Path(tmp) / "target"),
               "--index-url", args.index_url]  # fmt: skip
        for url in args.extra_index_url:
            cmd += ["--extra-index-url", url]
        for tag in platforms(args.glibc, args.arch):
            cmd += ["--platform", tag]
        subprocess.run([*cmd, *args.requirements], check=True)
        installs = json.loads(report.read_text())["install"]
    lines = [
        f"# Resolved by roles/vllm/files/lock/make_lock.py for CPython {args.python_version}, glibc "
        f"{args.glibc}, {args.arch}: {' '.join(args.requirements)}",
        "# pip install --require-hashes --no-deps -r <this file>: regenerate, never edit by hand.",
    ]
    for item in sorted(installs, key=lambda i: i["metadata"]["name"].lower()):
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not digest:
            sys.exit(f"no sha256 for {item['download_info'].get('url')}: the index gave none")
        lines.append(f"{item['metadata']['name']}=={item['metadata']['version']} --hash=sha256:{digest}")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{args.out}: {len(installs)} distributions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
