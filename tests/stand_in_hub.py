"""A local stand-in for the Hugging Face Hub, as strict as the real one for the calls a download makes.

huggingface_hub (2.4.0) downloads a repository with these requests, which this server answers the
way huggingface.co does (point the client at it with ``HF_ENDPOINT`` or ``endpoint=``):

- ``GET /api/models/<repo>/revision/<rev>``: the repository at a branch, tag or commit: ``sha``
  (the commit) and ``siblings``. An unknown revision is 404 with ``X-Error-Code: RevisionNotFound``.
- ``GET /api/models/<repo>/tree/<rev>?recursive=true``: files and directories, each file with its
  ``size`` and git blob ``oid``, LFS files also with ``lfs: {oid: sha256, size, pointerSize}``;
  paged with a ``Link: <...>; rel="next"`` header (``page_size`` entries a page).
- ``HEAD``/``GET /<repo>/resolve/<rev>/<path>``: a small file is answered in place with
  ``ETag`` (its git blob id) and ``X-Repo-Commit``; an LFS file is a 302 to a signed blob URL,
  with ``X-Linked-Etag`` (its sha256), ``X-Linked-Size`` and ``X-Repo-Commit``. A missing file is
  404 ``EntryNotFound``.
- ``GET /blobs/<sha256>?sig=...`` on a second server, the blob store (the hub's CDN, another
  origin: huggingface_hub sends it no token and does not follow the redirect on HEAD). It checks
  the signature, and honours ``Range: bytes=N-`` with 206 and ``Content-Range``.

Access, for a gated repository (``gated=True``) as the hub answers it: no token is 401
``GatedRepo``; a token the hub does not know is 401 "Invalid credentials in Authorization header";
a valid token without access (``granted`` lists those with access) is 403 ``GatedRepo`` with the
hub's message. An unknown repository is 401 ``RepoNotFound`` (the hub does not say whether it
exists). A non-gated repository is public.

Faults a test asks for, each once: ``cut_once`` (paths whose next body stops halfway and the
connection closes, as a dropped network does) and ``corrupt_once`` (paths whose next body has one
byte changed, its length right). Every request is logged with its method, path, Range and
Authorization headers, so a test can see what the client asked for.

Every JSON answer (this stand-in's and tests/unit/fake_hub.py's) is held to huggingface_hub's own
types before it leaves (``check_answer``): the client builds ``ModelInfo(**body)``, ``RepoFile`` and
``RepoFolder(**entry)`` from them and quietly keeps or drops a key it does not know, so a misspelt
field would pass unseen. Here a key outside the type's, or a value of the wrong JSON type, is a
500 naming it (logged, and kept in ``mismatches``); an error body must be the hub's
``{"error": message}``.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import inspect
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LOG = logging.getLogger(__name__)

COMMIT = "5f1c3a9e0b7d2c4e6f8091a2b3c4d5e6f7a8b9c0"
LFS_THRESHOLD = 1024  # files this size or larger are stored in LFS (the hub's own rule is 10 MiB)


class ResponseMismatch(Exception):
    """A body huggingface.co would never send: names the field and what is wrong with it."""


_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# The keys huggingface_hub 2.4.0 reads from a tree entry (RepoFile / RepoFolder.__init__ in
# hf_api.py); it drops any other. The hub lists a directory with size 0, which RepoFolder ignores.
_FILE_KEYS = frozenset({"type", "path", "size", "oid", "lfs", "xetHash", "lastCommit", "securityFileStatus"})
_FOLDER_KEYS = frozenset({"type", "path", "size", "oid", "lastCommit"})
_SIBLING_KEYS = frozenset({"rfilename", "size", "blobId", "lfs"})  # ModelInfo's RepoSibling
_LFS_KEYS = frozenset({"oid", "size", "pointerSize"})  # BlobLfsInfo


@functools.cache
def _model_info_keys() -> frozenset[str]:
    """The JSON keys ModelInfo.__init__ reads (each ``kwargs.pop("key")`` in its source)."""
    from huggingface_hub.hf_api import ModelInfo

    keys = set(re.findall(r'kwargs\.pop\("([^"]+)"', inspect.getsource(ModelInfo.__init__)))
    # It also takes the Python spelling of a few (last_modified beside lastModified, model_index
    # beside model-index); the hub writes only the other one.
    for key in list(keys):
        head, *rest = key.split("_")
        if rest and (head + "".join(r.capitalize() for r in rest) in keys or key.replace("_", "-") in keys):
            keys.discard(key)
    return frozenset(keys)


def _typed(
    where: str, value: Any, kind: type | tuple[type, ...], pattern: re.Pattern[str] | None = None
) -> None:
    if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
        raise ResponseMismatch(f"{where}: {value!r} is not a JSON {getattr(kind, '__name__', kind)}")
    if pattern is not None and not pattern.match(value):
        raise ResponseMismatch(f"{where}: {value!r} is not a {pattern.pattern} hash")


def _keys(where: str, entry: Any, allowed: frozenset[str], required: tuple[str, ...]) -> None:
    if not isinstance(entry, dict):
        raise ResponseMismatch(f"{where}: {entry!r} is not an object")
    unknown = set(entry) - allowed
    if unknown:
        raise ResponseMismatch(f"{where}.{sorted(unknown)[0]}: not a key huggingface_hub reads there")
    missing = [key for key in required if key not in entry]
    if missing:
        raise ResponseMismatch(f"{where}.{missing[0]}: missing")


def _lfs(where: str, lfs: Any) -> None:
    _keys(where, lfs, _LFS_KEYS, tuple(sorted(_LFS_KEYS)))
    _typed(f"{where}.oid", lfs["oid"], str, _HEX64)
    _typed(f"{where}.size", lfs["size"], int)
    _typed(f"{where}.pointerSize", lfs["pointerSize"], int)


def check_answer(kind: str, body: Any) -> None:
    """Raise ResponseMismatch unless ``body`` is what the hub sends as ``kind``.

    ``kind``: ``model_info`` (GET /api/models/<repo>[/revision/<rev>]), ``tree`` (one page of
    GET /api/models/<repo>/tree/<rev>) or ``error`` (any error status).
    """
    if kind == "error":
        if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], str):
            raise ResponseMismatch(f"error: {body!r} is not the hub's {{'error': message}}")
        return
    if kind == "model_info":
        from huggingface_hub.hf_api import ModelInfo

        _keys("ModelInfo", body, _model_info_keys(), ("id",))
        _typed("ModelInfo.id", body["id"], str)
        if "sha" in body:
            _typed("ModelInfo.sha", body["sha"], str, _HEX40)
        if "private" in body:
            _typed("ModelInfo.private", body["private"], bool)
        if "gated" in body and body["gated"] not in (False, "auto", "manual"):
            raise ResponseMismatch(f"ModelInfo.gated: {body['gated']!r} is none of false, 'auto', 'manual'")
        for index, sibling in enumerate(body.get("siblings") or []):
            where = f"ModelInfo.siblings[{index}]"
            _keys(where, sibling, _SIBLING_KEYS, ("rfilename",))
            _typed(f"{where}.rfilename", sibling["rfilename"], str)
            if "lfs" in sibling:
                _lfs(f"{where}.lfs", sibling["lfs"])
        ModelInfo(**body)  # and the client's own constructor takes it
        return
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    _typed("tree", body, list)
    for index, entry in enumerate(body):
        where = f"tree[{index}]"
        folder = isinstance(entry, dict) and entry.get("type") == "directory"
        _keys(where, entry, _FOLDER_KEYS if folder else _FILE_KEYS, ("type", "path", "oid"))
        if entry["type"] not in ("file", "directory"):
            raise ResponseMismatch(f"{where}.type: {entry['type']!r} is neither 'file' nor 'directory'")
        _typed(f"{where}.path", entry["path"], str)
        _typed(f"{where}.oid", entry["oid"], str, _HEX40)
        if folder:
            RepoFolder(**entry)
            continue
        _typed(f"{where}.size", entry.get("size"), int)
        if "lfs" in entry:
            _lfs(f"{where}.lfs", entry["lfs"])
        RepoFile(**entry)


def git_oid(data: bytes) -> str:
    """The git blob id of ``data``: what the hub reports as a file's ``oid`` and small files' ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class HubLog:
    """One request as the stand-in saw it."""

    method: str
    path: str
    range: str
    authorization: str


@dataclass
class StandInHub:
    """Serve ``files`` ({path: bytes}) as model repository ``repo`` at ``COMMIT`` (branch ``main``)."""

    repo: str
    files: dict[str, bytes]
    gated: bool = True
    tokens: tuple[str, ...] = ("hf_granted",)  # tokens the hub knows
    granted: tuple[str, ...] = ("hf_granted",)  # of those, the ones with access to the repo
    page_size: int = 50
    cut_once: set[str] = field(default_factory=set)
    corrupt_once: set[str] = field(default_factory=set)
    log: list[HubLog] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._secret = b"stand-in-cdn-signing-key"
        self._lock = threading.Lock()
        self.mismatches: list[str] = []  # answers refused because the hub would never send them
        self.servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn)) for cdn in (False, True)]
        for server in self.servers:
            server.mismatches = self.mismatches  # type: ignore[attr-defined]
        self.endpoint, self.cdn = (f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers)

    def __enter__(self) -> StandInHub:
        for server in self.servers:
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()

    def is_lfs(self, path: str) -> bool:
        return len(self.files[path]) >= LFS_THRESHOLD

    def sign(self, digest: str) -> str:
        return hmac.new(self._secret, digest.encode(), "sha256").hexdigest()[:32]

    def take_fault(self, faults: set[str], path: str) -> bool:
        """True once for a path in ``faults`` (the fault is then spent)."""
        with self._lock:
            if path in faults:
                faults.discard(path)
                return True
            return False

    def gets(self, path: str) -> list[HubLog]:
        """The GET requests that fetched ``path``'s bytes (its blob, or the file in place)."""
        if self.is_lfs(path):
            return [
                r for r in self.log if r.method == "GET" and r.path == f"/blobs/{sha256(self.files[path])}"
            ]
        where = re.compile(rf"/{re.escape(self.repo)}/resolve/[^/]+/{re.escape(path)}")
        return [r for r in self.log if r.method == "GET" and where.fullmatch(r.path)]

    def model_info(self, commit: str) -> dict[str, object]:
        """The repository at ``commit``, as GET /api/models/<repo>/revision/<rev> answers it."""
        return {"id": self.repo, "sha": commit, "gated": "manual" if self.gated else False, "private": False,
                "siblings": [{"rfilename": p} for p in sorted(self.files)]}  # fmt: skip

    def tree(self) -> list[dict[str, object]]:
        """The recursive tree listing: directories first in each level, as the hub sorts it."""
        dirs = sorted({"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)})
        out: list[dict[str, object]] = [
            {"type": "directory", "oid": git_oid(d.encode()), "size": 0, "path": d} for d in dirs
        ]
        for path in sorted(self.files):
            data = self.files[path]
            entry: dict[str, object] = {"type": "file", "oid": git_oid(data), "size": len(data), "path": path}
            if self.is_lfs(path):
                entry["lfs"] = {"oid": sha256(data), "size": len(data), "pointerSize": 134}
            out.append(entry)
        return out


class _Reply(Exception):
    """An error answer: status, X-Error-Code and X-Error-Message, as the hub sends them."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class HubHandler(BaseHTTPRequestHandler):
    """What every hub stand-in's handler needs: quiet, a body with its length (none for HEAD), JSON."""

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data: object, headers: dict[str, str] | None = None, kind: str = "model_info") -> None:
        """Send a 200 JSON answer once it passed ``check_answer``, else a 500 naming the field."""
        try:
            check_answer(kind, data)
        except ResponseMismatch as exc:
            LOG.error("hub stand-in answer to %s is not the hub's: %s", self.path, exc)
            getattr(self.server, "mismatches", []).append(str(exc))
            message = f"The stand-in's answer is not the hub's: {exc}"
            self._send(500, json.dumps({"error": message}).encode(),
                       {"Content-Type": "application/json", "X-Error-Message": message})  # fmt: skip
            return
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str, message: str) -> None:
        """An error as the hub sends it: ``{"error": message}``, X-Error-Code and X-Error-Message."""
        body = {"error": message}
        check_answer("error", body)
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps(body).encode(), headers)


def _handler(hub: StandInHub, cdn: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(HubHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the hub: a cut body is then a protocol error

        def _handle(self) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            hub.log.append(
                HubLog(
                    self.command, path, self.headers.get("Range", ""), self.headers.get("Authorization", "")
                )
            )
            try:
                if cdn:
                    if not path.startswith("/blobs/"):
                        raise _Reply(404, "", "No such key")
                    self._blob(path.removeprefix("/blobs/"), parse_qs(url.query))
                elif path.startswith("/api/models/"):
                    self._api(url.path.removeprefix("/api/models/"), parse_qs(url.query))
                else:
                    self._resolve(url.path.lstrip("/"))
            except _Reply as reply:
                self._error(reply.status, reply.code, reply.message)

        do_GET = do_HEAD = _handle  # http.server's naming

        def _check_access(self, repo: str) -> None:
            if repo != hub.repo:
                raise _Reply(401, "RepoNotFound", "Repository not found")
            if not hub.gated:
                return
            auth = self.headers.get("Authorization", "")
            token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
            if not token:
                raise _Reply(
                    401,
                    "GatedRepo",
                    f"Access to model {repo} is restricted. You must have access to it and be authenticated "
                    "to access it. Please log in.",
                )
            if token not in hub.tokens:
                raise _Reply(401, "", "Invalid credentials in Authorization header")
            if token not in hub.granted:
                raise _Reply(
                    403,
                    "GatedRepo",
                    f"Access to model {repo} is restricted and you are not in the authorized list. "
                    f"Visit {hub.endpoint}/{repo} to ask for access.",
                )

        def _revision(self, rev: str) -> str:
            if rev not in ("main", COMMIT):
                raise _Reply(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return COMMIT

        def _api(self, rest: str, query: dict[str, list[str]]) -> None:
            # <owner>/<name>/revision/<rev> or <owner>/<name>/tree/<rev>[/<path>]
            parts = rest.split("/")
            if len(parts) < 4 or parts[2] not in ("revision", "tree"):
                raise _Reply(404, "", "Sorry, we can't find the page you are looking for.")
            repo = "/".join(parts[:2])
            self._check_access(repo)
            commit = self._revision(unquote(parts[3]))
            if parts[2] == "revision":
                self._json(hub.model_info(commit))
                return
            if query.get("recursive") != ["true"]:
                raise _Reply(400, "", "this stand-in serves only recursive listings")
            tree = hub.tree()
            start = int(query.get("cursor", ["0"])[0])
            page = tree[start : start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(tree):
                nxt = f"{hub.endpoint}/api/models/{repo}/tree/{parts[3]}?recursive=true&cursor={start + hub.page_size}"
                headers["Link"] = f'<{nxt}>; rel="next"'
            self._json(page, headers, "tree")

        def _resolve(self, raw: str) -> None:
            # <owner>/<name>/resolve/<rev>/<path...>
            parts = raw.split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                raise _Reply(404, "", "Sorry, we can't find the page you are looking for.")
            repo = "/".join(parts[:2])
            self._check_access(repo)
            commit = self._revision(unquote(parts[3]))
            name = unquote("/".join(parts[4:]))
            if name not in hub.files:
                raise _Reply(404, "EntryNotFound", f'{name} does not exist on "{parts[3]}"')
            data = hub.files[name]
            if hub.is_lfs(name):
                digest = sha256(data)
                self._send(302, b"", {
                    "Location": f"{hub.cdn}/blobs/{digest}?sig={hub.sign(digest)}",
                    "X-Repo-Commit": commit, "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(data)),
                    "ETag": f'"{git_oid(data)}"',
                })  # fmt: skip
                return
            self._body(name, data, {"X-Repo-Commit": commit, "ETag": f'"{git_oid(data)}"'})

        def _blob(self, digest: str, query: dict[str, list[str]]) -> None:
            if query.get("sig") != [hub.sign(digest)]:
                raise _Reply(403, "", "Request not signed or signature expired")
            name = next((p for p, d in hub.files.items() if hub.is_lfs(p) and sha256(d) == digest), None)
            if name is None:
                raise _Reply(404, "", "No such blob")
            self._body(name, hub.files[name], {"ETag": f'"{digest}"'})

        def _body(self, name: str, data: bytes, headers: dict[str, str]) -> None:
            """The file's bytes (or those from a Range on), with the faults a test asked for."""
            headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
            start, status = 0, 200
            wanted = self.headers.get("Range", "")
            if wanted:
                if not (wanted.startswith("bytes=") and wanted.endswith("-")):
                    raise _Reply(416, "", f"this stand-in serves only open ranges, got {wanted}")
                start = int(wanted.removeprefix("bytes=").removesuffix("-"))
                if start >= len(data):
                    raise _Reply(416, "", f"range {wanted} starts past the end ({len(data)} bytes)")
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            if self.command == "GET" and hub.take_fault(hub.corrupt_once, name):
                body = body[:-1] + bytes([body[-1] ^ 0xFF])
            if self.command == "GET" and hub.take_fault(hub.cut_once, name):
                self.send_response(status)
                for key, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self._send(status, body, headers)

    return Handler
