"""Fetch a model repository from the Hugging Face Hub into DEST, every file verified.

    python -m repack.fetch --repo google/gemma-4-E2B-it-qat-q4_0-unquantized --revision main --dest DIR

Files land in a staging directory beside DEST (``.DEST.partial``), which outlives a stopped run:
the next run keeps every file already complete and verified and fetches only the rest, and a
connection cut mid-file is resumed from where it stopped (huggingface_hub asks for the rest with a
Range request). Every file is checked against the hub's listing: its size, then its sha256 for an
LFS file or its git blob id for a small one; a file that fails is fetched once more, and a second
failure stops the run. Only when all files are verified is the staging directory renamed to DEST,
with ``fetch.json`` recording the repository, the commit and every file's size and hash.

The token comes from the environment variable named by ``--token-env`` (default HF_TOKEN), or
from stdin with ``--token-stdin`` (so no command line shows it); ``--token-name`` is what a refusal
names. The endpoint is HF_ENDPOINT's (default, huggingface.co). Progress goes to stderr, one line
a file and the bytes so far; the last line on stdout is a JSON object: changed, commit, files, bytes.

Exit codes: 0 fetched or already there, 1 a file failed verification twice or the hub failed,
2 access refused (401/403), unknown repository or revision, or DEST in the way.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

STAMP = "fetch.json"
EXIT_FAILED = 1
EXIT_REFUSED = 2
_CHUNK = 8 << 20


class FetchError(Exception):
    """A fetch that cannot go on; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Expected:
    """One file as the hub lists it: the size and the hash to check it against."""

    path: str
    size: int
    sha256: str | None  # LFS files
    git_oid: str  # every file: the git blob id (for an LFS file, that of its pointer)

    def check(self, file: Path) -> str | None:
        """None when ``file`` is this one; otherwise what is wrong, in a few words."""
        if not file.is_file():
            return "missing"
        size = file.stat().st_size
        if size != self.size:
            return f"{size} bytes, the hub lists {self.size}"
        if self.sha256 is not None:
            got, want = _digest(file, hashlib.sha256()), self.sha256
            kind = "sha256"
        else:
            got, want = _digest(file, hashlib.sha1(b"blob %d\0" % size)), self.git_oid
            kind = "git blob id"
        return None if got == want else f"{kind} {got}, the hub lists {want}"


def _digest(file: Path, h: hashlib._Hash) -> str:
    with file.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB" if n >= 2**18 else f"{n} B"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def refusal(exc: Exception, repo: str, revision: str, token_name: str) -> FetchError | None:
    """The one line for an answer that no retry will change: no access, no such repo or revision."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, RevisionNotFoundError):
        return FetchError(f"{repo} has no revision {revision!r} (a branch, tag or commit)", EXIT_REFUSED)
    status = exc.response.status_code if isinstance(exc, HfHubHTTPError) and exc.response is not None else 0
    said = _one_line(getattr(exc, "server_message", "") or "")
    if isinstance(exc, GatedRepoError) or status == 403 or (status == 401 and "credentials" in said):
        return FetchError(
            f"the hub refused {repo} ({status}: {said or 'no access'}); "
            f"put a token with access to {repo} in {token_name}",
            EXIT_REFUSED,
        )
    if isinstance(exc, RepositoryNotFoundError):
        return FetchError(
            f"the hub has no repository {repo} that {token_name} can see ({status}); "
            f"check the id, or put a token with access to it in {token_name}",
            EXIT_REFUSED,
        )
    return None


@contextmanager
def _locked(dest: Path) -> Iterator[None]:
    """One fetch per DEST: an flock on ``.DEST.fetch-lock`` beside it (kept, like repack's locks)."""
    lock = dest.parent / f".{dest.name}.fetch-lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FetchError(f"{dest} is being fetched by another run (lock {lock})", EXIT_REFUSED) from None
        yield
    finally:
        os.close(fd)


def listing(api: object, repo: str, commit: str) -> list[Expected]:
    """Every file at ``commit``, as the hub lists them (its tree, all pages)."""
    from huggingface_hub.hf_api import RepoFile

    files = [
        Expected(f.path, f.size, f.lfs.sha256 if f.lfs is not None else None, f.blob_id)
        for f in api.list_repo_tree(repo_id=repo, revision=commit, recursive=True)  # type: ignore[attr-defined]
        if isinstance(f, RepoFile)
    ]
    return sorted(files, key=lambda e: e.path)


def fetch(
    repo: str,
    revision: str,
    dest: Path,
    *,
    token: str | None,
    token_name: str,
    endpoint: str | None = None,
    quiet: bool = False,
    say: Callable[[str], None] = lambda line: print(f"fetch: {line}", file=sys.stderr, flush=True),
) -> dict[str, object]:
    """Fetch ``repo`` at ``revision`` into ``dest`` (see the module's docstring); the summary."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import disable_progress_bars

    if quiet:
        disable_progress_bars()
    dest = Path(dest).absolute()
    if not dest.parent.is_dir():
        raise FetchError(f"cannot write {dest}: its parent directory does not exist", EXIT_REFUSED)
    api = HfApi(endpoint=endpoint, token=token)
    try:
        commit = str(api.repo_info(repo_id=repo, revision=revision).sha)
        if dest.exists():
            return _already_there(dest, repo, commit)
        files = listing(api, repo, commit)
    except HfHubHTTPError as exc:
        raise refusal(exc, repo, revision, token_name) or FetchError(
            f"the hub failed listing {repo}@{revision}: {_one_line(str(exc))}"
        ) from None
    total = sum(e.size for e in files)
    staging = dest.parent / f".{dest.name}.partial"

    def get(path: str, force: bool) -> None:
        try:
            hf_hub_download(
                repo,
                path,
                revision=commit,
                local_dir=staging,
                token=token,
                endpoint=endpoint,
                force_download=force,
            )
        except HfHubHTTPError as exc:
            raise refusal(exc, repo, revision, token_name) or FetchError(
                f"the hub failed on {repo}/{path}: {_one_line(str(exc))}"
            ) from None
        except OSError as exc:
            raise FetchError(f"fetching {repo}/{path} failed: {_one_line(str(exc))}") from None

    with _locked(dest):
        say(f"{repo}@{revision} (commit {commit}): {len(files)} files, {_gib(total)} -> {dest}")
        done = 0
        for i, e in enumerate(files, 1):
            how = _fetch_one(
                e,
                staging,
                lambda force, e=e: get(e.path, force),
                lambda line, i=i: say(f"[{i}/{len(files)}] {line}"),
            )
            done += e.size
            say(f"[{i}/{len(files)}] {e.path}: {_gib(e.size)}, {how}; {_gib(done)} of {_gib(total)}")
        shutil.rmtree(staging / ".cache", ignore_errors=True)  # huggingface_hub's download metadata
        listed = {staging / e.path for e in files}
        for stray in [p for p in staging.rglob("*") if p.is_file() and p not in listed]:
            stray.unlink()  # left by a stopped fetch of another commit: not part of this one
        stamp = {
            "repo": repo, "revision": revision, "commit": commit,
            "files": {e.path: {"size": e.size, "sha256": e.sha256, "git_oid": e.git_oid} for e in files},
        }  # fmt: skip
        (staging / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
        os.rename(staging, dest)
    say(f"{dest}: {len(files)} files, {_gib(total)}, all verified")
    return {"changed": True, "commit": commit, "files": len(files), "bytes": total}


def _fetch_one(e: Expected, staging: Path, get: Callable[[bool], None], say: Callable[[str], None]) -> str:
    """Make ``staging/e.path`` the hub's file: keep it if it verifies, else fetch it, at most twice.

    A file left by an earlier run is kept only after its hash is checked again; one that fails
    (damaged on disk, or cut short) is fetched anew. What the hub sent is checked the same way.
    """
    file = staging / e.path
    how = "sha256" if e.sha256 else "git blob id"
    there = file.exists()
    if there and e.check(file) is None:
        return f"{how} verified (kept from an earlier run)"
    get(there)  # force: huggingface_hub would keep a file its metadata calls complete
    problem = e.check(file)
    if problem is None:
        return f"{how} verified"
    say(f"{e.path}: {problem}; fetching it again")
    get(True)
    problem = e.check(file)
    if problem is None:
        return f"{how} verified (fetched again)"
    raise FetchError(
        f"{e.path} fails verification twice ({problem}); nothing was put in place "
        f"(the staging directory {staging} is kept for the next run)"
    )


def _already_there(dest: Path, repo: str, commit: str) -> dict[str, object]:
    """DEST from an earlier fetch of the same commit is kept; anything else there is not ours to replace."""
    try:
        stamp = json.loads((dest / STAMP).read_text())
    except (OSError, ValueError):
        stamp = {}
    if isinstance(stamp, dict) and stamp.get("repo") == repo and stamp.get("commit") == commit:
        files = stamp.get("files") or {}
        return {
            "changed": False,
            "commit": commit,
            "files": len(files),
            "bytes": sum(f["size"] for f in files.values()),
        }
    raise FetchError(
        f"{dest} exists and is not a fetch of {repo} at {commit} (its {STAMP} says otherwise); "
        "move it away or choose another --dest",
        EXIT_REFUSED,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m repack.fetch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--repo", required=True, help="hub id, e.g. google/gemma-4-E2B-it-qat-q4_0-unquantized")
    ap.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")
    ap.add_argument(
        "--dest", required=True, type=Path, help="directory to create (renamed into place when complete)"
    )
    ap.add_argument(
        "--token-env", default="HF_TOKEN", metavar="VAR", help="environment variable holding the token"
    )
    ap.add_argument(
        "--token-stdin", action="store_true", help="read the token from stdin instead (empty: none)"
    )
    ap.add_argument("--token-name", metavar="NAME", help="what a refusal names as the token (default: VAR)")
    ap.add_argument(
        "-q", "--quiet", action="store_true", help="no byte progress bars (the per-file lines stay)"
    )
    args = ap.parse_args(argv)
    token = (sys.stdin.read() if args.token_stdin else os.environ.get(args.token_env, "")).strip() or None
    name = args.token_name or args.token_env
    try:
        summary = fetch(args.repo, args.revision, args.dest, token=token, token_name=name, quiet=args.quiet)
    except FetchError as exc:
        print(f"fetch: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(
            "fetch: interrupted; complete files are kept for the next run, nothing is at DEST",
            file=sys.stderr,
        )
        return 130
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
