"""A local stand-in for the Hugging Face Hub, enough for huggingface_hub's snapshot_download.

It serves one gated model repo: every request must carry ``Authorization: Bearer <token>`` (as the
hub asks for a gated or private repo), else 401. It answers what snapshot_download asks, following
the hub's HTTP API as huggingface_hub calls it: ``GET /api/models/<repo>/revision/<rev>`` (the
commit sha), ``GET /api/models/<repo>/tree/<sha>?recursive=...`` (the file list), then ``HEAD`` and
``GET /<repo>/resolve/<sha>/<file>`` with the ``X-Repo-Commit`` and ``ETag`` headers. Every request
is logged with the token it carried, so a test can show the token reached the hub.
"""

from __future__ import annotations

import hashlib
import threading
from http.server import ThreadingHTTPServer
from types import TracebackType
from urllib.parse import unquote, urlsplit

from tests.stand_in_hub import HubHandler

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serve ``files`` ({path: bytes}) as ``repo`` to holders of ``token``; log every request."""

    def __init__(self, repo: str, token: str, files: dict[str, bytes]) -> None:
        self.repo, self.token, self.files = repo, token, files
        self.log: list[dict[str, str]] = []
        hub = self

        class Handler(HubHandler):
            def _handle(self) -> None:
                path = unquote(urlsplit(self.path).path)
                auth = self.headers.get("Authorization", "")
                hub.log.append({"method": self.command, "path": path, "authorization": auth})
                if auth != f"Bearer {hub.token}":
                    self._error(401, "GatedRepo", "Access to this gated repo is restricted")
                    return
                api = f"/api/models/{hub.repo}"
                if path.startswith(f"{api}/revision/"):
                    self._json(
                        {"id": hub.repo, "sha": SHA, "siblings": [{"rfilename": f} for f in hub.files]}
                    )
                elif path.startswith(f"{api}/tree/"):
                    self._json(
                        [
                            {"type": "file", "path": name, "size": len(data), "oid": _oid(data)}
                            for name, data in hub.files.items()
                        ],
                        kind="tree",
                    )
                elif path.startswith(f"/{hub.repo}/resolve/"):
                    name = path.split("/resolve/", 1)[1].split("/", 1)[1]
                    if name not in hub.files:
                        self._error(404, "EntryNotFound", f'{name} does not exist on "{SHA}"')
                        return
                    data = hub.files[name]
                    self._send(200, data, {"X-Repo-Commit": SHA, "ETag": f'"{_oid(data)}"'})
                else:
                    self._error(404, "RepoNotFound", "Repository not found")

            do_GET = do_HEAD = _handle  # http.server's naming

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.mismatches: list[str] = []  # answers refused because the hub would never send them
        self.server.mismatches = self.mismatches  # type: ignore[attr-defined]
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()


def _oid(data: bytes) -> str:
    """The git blob id the hub reports for a small (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's own hash
