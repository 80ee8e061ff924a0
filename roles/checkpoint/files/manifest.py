#!/usr/bin/env python3
"""Checkpoint manifests: make, compare and verify ``MANIFEST.sha256`` (``sha256sum`` format).

Runs on the controller (to make the manifest of a checkpoint to push) and on the rig (to list the
files still to send, which is what makes an interrupted push resume, and to verify the result).
Standard library only: the rig's system Python runs it. Prints one JSON object on stdout;
progress for large files goes to stderr.

  manifest.py make DIR            write DIR/MANIFEST.sha256 when it differs; print version, files
  manifest.py need DIR MANIFEST   files of MANIFEST that DIR lacks or holds with another hash
  manifest.py verify DIR          exit 1 unless every file of DIR/MANIFEST.sha256 matches
  manifest.py probe MODELS VERSION CURRENT
                                  one look at the rig before a push: the models directory's owner,
                                  group and mode, the files the named VERSION directory lacks (null
                                  when it has no manifest) and where the CURRENT link points
  manifest.py plan DIR FILES      what a push into the staging DIR still has to send: FILES is the
                                  JSON list of {path, size, sha256} that `make` printed; prints the
                                  files to send, those to remove first, the bytes still to send, the
                                  bytes already there (a partial file resumes) and the free bytes
"""

from __future__ import annotations

import argparse
import grp
import hashlib
import json
import os
import pwd
import sys
import tempfile
from pathlib import Path

MANIFEST = "MANIFEST.sha256"
CHUNK = 8 * 1024 * 1024
# Files above this size get a progress line on stderr (hashing 3 GB takes a while).
PROGRESS_BYTES = 512 * 1024 * 1024


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks so multi-GB shards use bounded memory."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    done = 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if size >= PROGRESS_BYTES and done % (CHUNK * 64) == 0:
                print(f"hashing {path.name}: {done * 100 // size}%", file=sys.stderr, flush=True)
    return digest.hexdigest()


def checkpoint_files(root: Path) -> list[str]:
    """Relative paths of the files making up a checkpoint: hidden entries and the manifest excluded."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or (Path(dirpath) == root and name == MANIFEST):
                continue
            found.append(str((Path(dirpath) / name).relative_to(root)))
    return sorted(found)


def render(root: Path) -> str:
    """The manifest text for ``root``: one ``<sha256>  <path>`` line per file, sorted."""
    return "".join(f"{sha256_file(root / rel)}  {rel}\n" for rel in checkpoint_files(root))


def parse(text: str) -> dict[str, str]:
    """{path: sha256} from a manifest; raises ValueError on a malformed line."""
    entries = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel or rel.startswith("/") or ".." in Path(rel).parts:
            raise ValueError(f"{MANIFEST} line {number} is malformed: {line!r}")
        entries[rel] = digest
    return entries


def version(text: str) -> str:
    """The checkpoint version: a short hash of its manifest."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def write_if_changed(path: Path, text: str) -> bool:
    """Atomically replace ``path`` with ``text`` unless it already holds it."""
    if path.is_file() and path.read_text() == text:
        return False
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


def need(root: Path, entries: dict[str, str]) -> list[str]:
    """Paths of ``entries`` that ``root`` lacks or holds with another content."""
    missing = []
    for rel, digest in sorted(entries.items()):
        target = root / rel
        if not target.is_file() or sha256_file(target) != digest:
            missing.append(rel)
    return missing


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of ``path`` (or its nearest parent)."""
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def plan(root: Path, files: list[dict]) -> dict:
    """What a resumable push into ``root`` still has to send.

    A file shorter than its source is taken as the interrupted start of it (rsync --partial kept
    it; --append-verify sends the rest and then checks the whole file). One as long as its source
    or longer but with another hash must be removed first, since rsync would skip it. Hidden
    files are temporary files of a transfer that was killed outright: they are removed too.
    """
    need, remove, to_send, resumed = [], [], 0, 0
    for entry in files:
        rel, size = entry["path"], int(entry["size"])
        target = root / rel
        have = target.stat().st_size if target.is_file() else 0
        if have == size and sha256_file(target) == entry["sha256"]:
            continue
        need.append(rel)
        if have >= size:
            remove.append(rel)
            have = 0
        to_send += size - have
        resumed += have
    if root.is_dir():
        for dirpath, _dirnames, filenames in os.walk(root):
            remove += [
                str((Path(dirpath) / n).relative_to(root))
                for n in filenames
                if n.startswith(".") and n != MANIFEST
            ]
    return {
        "need": need,
        "remove": sorted(remove),
        "to_send": to_send,
        "resumed": resumed,
        "free": free_bytes(root),
    }


def owner_line(path: Path) -> str:
    """``"<owner> <group> <octal mode>"`` of ``path`` itself (a link is not followed), as ``stat -c '%U %G %a'``."""
    st = path.lstat()
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{user} {group} {st.st_mode & 0o7777:o}"


def probe(models: Path, version_dir: Path, current: Path) -> dict:
    """What a converged push would otherwise ask in several round trips, asked in one.

    ``models``: owner line of the models directory ("" when it is missing). ``need``: files of the
    version's manifest it lacks or holds wrong (None when it has no manifest: never pushed or not
    finished). ``current``: the link's target and owner line ("" when it is no link).
    """
    manifest = version_dir / MANIFEST
    return {
        "models": owner_line(models) if models.is_dir() else "",
        "need": need(version_dir, parse(manifest.read_text())) if manifest.is_file() else None,
        "current": f"{os.readlink(current)} {owner_line(current)}" if current.is_symlink() else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make", help="write DIR/MANIFEST.sha256 when it differs")
    make.add_argument("dir", type=Path)
    nd = sub.add_parser("need", help="list the files of MANIFEST that DIR lacks or holds wrong")
    nd.add_argument("dir", type=Path)
    nd.add_argument("manifest", type=Path)
    ver = sub.add_parser("verify", help="exit 1 unless DIR matches DIR/MANIFEST.sha256")
    ver.add_argument("dir", type=Path)
    pr = sub.add_parser(
        "probe", help="the models directory, a version's missing files and the current link, at once"
    )
    pr.add_argument("models", type=Path)
    pr.add_argument("version_dir", type=Path)
    pr.add_argument("current", type=Path)
    pl = sub.add_parser("plan", help="what a push into DIR still has to send, and the free space")
    pl.add_argument("dir", type=Path)
    pl.add_argument("files", help="JSON list of {path, size, sha256} (the `files` that make prints)")
    args = parser.parse_args(argv)

    try:
        if args.command == "make":
            if not args.dir.is_dir():
                raise ValueError(f"checkpoint directory {args.dir} does not exist")
            files = checkpoint_files(args.dir)
            if not files:
                raise ValueError(f"checkpoint directory {args.dir} holds no files")
            text = render(args.dir)
            changed = write_if_changed(args.dir / MANIFEST, text)
            sizes = {rel: (args.dir / rel).stat().st_size for rel in files}
            digests = parse(text)
            result = {
                "changed": changed,
                "version": version(text),
                "files": [{"path": rel, "size": sizes[rel], "sha256": digests[rel]} for rel in files],
                "bytes": sum(sizes.values()),
            }
        elif args.command == "plan":
            try:
                files = json.loads(args.files)
                for entry in files:
                    parse(f"{entry['sha256']}  {entry['path']}")
                    int(entry["size"])
            except (ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"FILES is not a JSON list of {{path, size, sha256}}: {exc}") from exc
            result = plan(args.dir, files)
        elif args.command == "probe":
            result = probe(args.models, args.version_dir, args.current)
        elif args.command == "need":
            text = args.manifest.read_text()
            entries = parse(text)
            missing = need(args.dir, entries) if args.dir.is_dir() else sorted(entries)
            result = {"version": version(text), "need": missing, "have": len(entries) - len(missing)}
        else:
            entries = parse((args.dir / MANIFEST).read_text())
            bad = need(args.dir, entries)
            result = {"ok": not bad, "bad": bad, "files": len(entries)}
            print(json.dumps(result))
            if bad:
                print(f"{len(bad)} file(s) do not match {MANIFEST}: {', '.join(bad)}", file=sys.stderr)
            return 1 if bad else 0
    except (OSError, ValueError) as exc:
        print(f"manifest.py {args.command}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
