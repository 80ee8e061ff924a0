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
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "5f1c3a9e0b7d2c4e6f8091a2b3c4d5e6f7a8b9c0"
LFS_THRESHOLD = 1024  # files this size or larger are stored in LFS (the hub's own rule is 10 MiB)


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
        self.servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, cdn)) for cdn in (False, True)]
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

    def _json(self, data: object, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})


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
                body = json.dumps({"error": reply.message}).encode()
                self._send(
                    reply.status,
                    body,
                    {
                        "Content-Type": "application/json",
                        "X-Error-Code": reply.code,
                        "X-Error-Message": reply.message,
                    },
                )

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
                siblings = [{"rfilename": p} for p in sorted(hub.files)]
                self._json({"id": repo, "modelId": repo, "sha": commit, "gated": "manual" if hub.gated else False,
                            "private": False, "siblings": siblings})  # fmt: skip
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
            self._json(page, headers)

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
