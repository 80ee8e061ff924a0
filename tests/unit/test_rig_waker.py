"""The gateway's rig-waker (roles/gateway/files/rig-waker) against the fake Compute API, over real HTTP.

Each test runs the waker as the gateway host does (its own process, python3, the JSON configuration
the role renders) in front of two stopped fake instances, each backed by a fake rig whose /health
answers 200 only a moment after its instance was started. The fake API checks the waker's token
against the four permissions docs/gateway.md gives its service account. HAProxy is left out: the
waker is called as HAProxy's backup server calls it, with the backend in X-Gemma-Rig-Backend.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import ROOT
from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_rig import FakeRig

WAKER = ROOT / "roles" / "gateway" / "files" / "rig-waker"
MODEL = "tiny-emb4"
PROJECT = "p1"
ZONES = {"rig-a": "us-central1-a", "rig-b": "us-central1-b"}
TOKEN = "waker-token-0123"  # a test-only token
MINIMAL = {
    "compute.instances.get",
    "compute.instances.start",
    "compute.zoneOperations.get",
    "compute.zoneOperations.list",  # spot recovery: why an instance stopped
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RigBehindVm:
    """A fake rig as the VM's workload: its vLLM is healthy a moment after the VM starts."""

    def __init__(self, rig: FakeRig, boot: float = 0.3) -> None:
        self.rig, self.boot = rig, boot
        self.rig.healthy = False
        self.on = False

    def running(self) -> bool:
        return self.on

    def start(self) -> None:
        self.on = True
        threading.Timer(self.boot, setattr, (self.rig, "healthy", True)).start()

    def stop(self) -> None:
        self.on = self.rig.healthy = False


class Stack:
    """The fake API, two fake rigs behind stopped instances, and the waker in front."""

    def __init__(self, tmp: Path, faults: Faults, token: dict | None = None) -> None:
        self.tmp = tmp
        self.token = token
        self.fake = FakeComputeServer(faults, permissions={TOKEN: set(MINIMAL)})
        self.rigs = {name: FakeRig(MODEL, stream_pause=0.05) for name in ZONES}
        self.decoy = FakeRig(MODEL)  # what a hostile request would like to reach
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> dict:
        rigs = [
            {
                "name": n,
                "address": "127.0.0.1",
                "port": r.port,
                "project": PROJECT,
                "zone": ZONES[n],
                "instance": n,
            }
            for n, r in self.rigs.items()
        ]
        token = self.tmp / "token"
        token.write_text(TOKEN + "\n")
        return {
            "port": self.port,
            "api": self.fake.endpoint,
            "token": self.token or {"file": str(token)},
            "timeout": 20,
            "poll": 0.05,
            "failure_memory": 30,
            "rigs": rigs,
            "backends": {
                "be_default": ["rig-a", "rig-b"],
                f"model_{MODEL}": ["rig-a", "rig-b"],
                "model_x": [],
            },
        }

    def __enter__(self) -> Stack:
        self.fake.start()
        for name, rig in self.rigs.items():
            rig.__enter__()
            self.fake.api.seed_instance(PROJECT, ZONES[name], name, RigBehindVm(rig))
        self.decoy.__enter__()
        path = self.tmp / "waker.json"
        path.write_text(json.dumps(self.config()))
        # Its journal, in a file: a test can read the decisions while it runs.
        with (self.tmp / "waker.log").open("w") as journal:
            self.proc = subprocess.Popen([sys.executable, str(WAKER), "--config", str(path)], stderr=journal)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.02)
        raise AssertionError("rig-waker did not start")

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=10)
        for rig in [*self.rigs.values(), self.decoy]:
            rig.__exit__(None, None, None)
        self.fake.stop()

    @property
    def log(self) -> str:
        """What the waker logged so far (one line per decision)."""
        return (self.tmp / "waker.log").read_text()

    def starts(self) -> list[str]:
        return [r["path"].split("/")[-2] for r in self.fake.api.requests("POST", "/start")]

    def sdk(self, backend: str = "be_default") -> openai.OpenAI:
        """The official client with its default timeout and retries, as a gateway client has it."""
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="unused", default_headers={"X-Gemma-Rig-Backend": backend}
        )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with Stack(tmp_path, Faults(op_delay=0.2)) as s:
        yield s


def chat(client: openai.OpenAI) -> str:
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    return answer.choices[0].message.content or ""


def test_a_cold_request_starts_a_rig_and_is_answered(stack: Stack) -> None:
    assert chat(stack.sdk()) and stack.starts() == ["rig-a"]
    # Warm now: a second request is forwarded without another start.
    stream = stack.sdk(f"model_{MODEL}").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "Paris" and stack.starts() == ["rig-a"]
    assert stack.fake.api.mismatches == []


def test_concurrent_cold_requests_share_one_start(stack: Stack) -> None:
    client = stack.sdk()
    answers: list[str] = []
    threads = [threading.Thread(target=lambda: answers.append(chat(client))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(answers) == 8 and all(answers)
    assert stack.starts() == ["rig-a"]


def test_a_stockout_moves_to_the_next_rig(tmp_path: Path) -> None:
    with Stack(tmp_path, Faults(op_delay=0.1, stockout_zones={ZONES["rig-a"]})) as stack:
        assert chat(stack.sdk())
        assert stack.starts() == ["rig-a", "rig-b"]
        assert [e for e in stack.rigs["rig-b"].log if e["path"] != "/health"]
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in stack.log


def test_when_no_rig_can_start_the_client_hears_why_at_once(tmp_path: Path) -> None:
    with Stack(tmp_path, Faults(op_delay=0.1, stockout_zones=set(ZONES.values()))) as stack:
        # A hang would be the SDK's timeout error (8 s for all three tries), not the waker's answer.
        with pytest.raises(openai.InternalServerError) as caught:
            chat(stack.sdk().with_options(timeout=8))  # the SDK's 2 retries included
        assert "ZONE_RESOURCE_POOL_EXHAUSTED" in str(caught.value)
        assert stack.starts() == ["rig-a", "rig-b"]  # the retries started nothing more
        # A backend no rig serves: the same kind of answer, nothing started.
        with pytest.raises(openai.InternalServerError, match="no rig serves backend model_x"):
            chat(stack.sdk("model_x"))
        assert stack.starts() == ["rig-a", "rig-b"]


def test_the_minimal_permissions_start_but_cannot_delete_or_insert(stack: Stack) -> None:
    assert chat(stack.sdk())  # the waker's token: get, start, zoneOperations.get
    base = f"{stack.fake.endpoint}/compute/v1/projects/{PROJECT}/zones/{ZONES['rig-b']}/instances"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    deleted = httpx.delete(f"{base}/rig-b", headers=auth)
    assert deleted.status_code == 403
    error = deleted.json()["error"]
    assert error["message"] == (
        f"Required 'compute.instances.delete' permission for 'projects/{PROJECT}/zones/{ZONES['rig-b']}/instances/rig-b'"
    )
    assert error["errors"][0]["reason"] == "forbidden"
    inserted = httpx.post(base, headers=auth, json={"name": "vm9"})
    assert inserted.status_code == 403 and "'compute.instances.create' permission" in inserted.text
    stopped = httpx.post(f"{base}/rig-b/stop", headers=auth)
    assert stopped.status_code == 403 and "'compute.instances.stop' permission" in stopped.text
    for bad in ({}, {"Authorization": "Bearer someone-else"}, {"Authorization": TOKEN}):
        assert httpx.get(f"{base}/rig-b", headers=bad).status_code == 401
    assert stack.fake.api.instances[(ZONES["rig-b"], "rig-b")]["status"] == "TERMINATED"


def test_a_token_without_start_is_refused_and_named(tmp_path: Path) -> None:
    with Stack(tmp_path, Faults(op_delay=0.1)) as stack:
        (tmp_path / "token").write_text("read-only\n")  # read on each call: a rotated file is used at once
        stack.fake.httpd.RequestHandlerClass.permissions["read-only"] = {"compute.instances.get"}
        with pytest.raises(openai.InternalServerError, match=r"compute\.instances\.start"):
            chat(stack.sdk())
        assert all(not rig.healthy for rig in stack.rigs.values())


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: s.recv(65536), b""))


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({}, b'{"model": "m"}', 400),  # no backend named
        ({"X-Gemma-Rig-Backend": "be_nothing"}, b'{"model": "m"}', 400),
        ({"X-Gemma-Rig-Backend": "../../etc"}, b'{"model": "m"}', 400),
        ({"X-Gemma-Rig-Backend": "be_default"}, b"\xff\xfe not json", 400),
        ({"X-Gemma-Rig-Backend": "be_default"}, b"[1, 2]", 400),
        ({"X-Gemma-Rig-Backend": "be_default", "Content-Length": "-5"}, b"", 400),
        ({"X-Gemma-Rig-Backend": "be_default", "Content-Length": str(10**12)}, b"", 413),
        (
            {"X-Gemma-Rig-Backend": "be_default", "Transfer-Encoding": "chunked"},
            b"-5\r\nabc\r\n0\r\n\r\n",
            400,
        ),
        ({"X-Gemma-Rig-Backend": "be_default", "Transfer-Encoding": "chunked"}, b"zz\r\n", 400),
    ],
)
def test_hostile_requests_get_a_clear_4xx_and_start_nothing(
    stack: Stack, headers: dict[str, str], body: bytes, status: int
) -> None:
    lines = [b"POST /v1/chat/completions HTTP/1.1", b"Host: x"]
    if "Content-Length" not in headers and "Transfer-Encoding" not in headers:
        headers = {**headers, "Content-Length": str(len(body))}
    lines += [f"{k}: {v}".encode() for k, v in headers.items()]
    answer = raw(stack.port, b"\r\n".join(lines) + b"\r\n\r\n" + body)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == status and error["message"]
    assert stack.starts() == []


def test_the_forward_target_never_comes_from_the_request(stack: Stack) -> None:
    decoy = f"127.0.0.1:{stack.decoy.port}"
    # The absolute form names another host: refused, nothing started.
    answer = raw(
        stack.port,
        f"POST http://{decoy}/v1/chat/completions HTTP/1.1\r\nHost: {decoy}\r\n"
        "X-Gemma-Rig-Backend: be_default\r\nContent-Length: 2\r\n\r\n{}".encode(),
    )
    assert answer.startswith(b"HTTP/1.1 400 ") and stack.starts() == []
    # Host, forwarding headers and the body naming the decoy: the configured rig answers.
    hostile = {
        "Host": decoy,
        "X-Forwarded-Host": decoy,
        "Forwarded": f"host={decoy}",
        "X-Gemma-Rig-Backend": "be_default",
    }
    body = {"model": MODEL, "messages": [], "base_url": f"http://{decoy}", "url": f"http://{decoy}/v1"}
    response = httpx.post(stack.url + "/v1/chat/completions", headers=hostile, json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert stack.decoy.log == []
    assert [e["path"] for e in stack.rigs["rig-a"].log if e["path"] != "/health"] == ["/v1/chat/completions"]


def test_a_stream_is_relayed_chunk_by_chunk(stack: Stack) -> None:
    """The rig sends each chunk only once the client has read the one before (FakeRig.lockstep): a
    waker that held a chunk back for more would wait for good, and the rig cut the stream."""
    assert chat(stack.sdk())  # rig-a is up now
    rig = stack.rigs["rig-a"]
    rig.lockstep = threading.Semaphore(0)
    try:
        stream = stack.sdk().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=6
        )
        texts = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                texts.append(chunk.choices[0].delta.content)
                rig.lockstep.release()
    finally:
        rig.lockstep = None
    assert texts == [f"t{n}" for n in range(6)], texts


class Metadata:
    """The GCE metadata server's token endpoint: answers only a request with Metadata-Flavor: Google."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        calls = self.calls = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                calls.append(self.headers.get("Metadata-Flavor"))
                ok = self.headers.get("Metadata-Flavor") == "Google"
                body = json.dumps(
                    {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}
                ).encode()
                self.send_response(200 if ok else 403)
                self.send_header("Content-Length", str(len(body) if ok else 0))
                self.end_headers()
                if ok:
                    self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        path = "/computeMetadata/v1/instance/service-accounts/default/token"
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"


def test_the_token_comes_from_the_metadata_server_once(tmp_path: Path) -> None:
    metadata = Metadata()
    try:
        with Stack(tmp_path, Faults(op_delay=0.1), token={"metadata": metadata.url}) as stack:
            assert chat(stack.sdk()) and stack.starts() == ["rig-a"]
            stack.rigs["rig-a"].healthy = False  # down again: the next request asks the API again
            stack.fake.api.backings[(ZONES["rig-a"], "rig-a")].on = False
            assert chat(stack.sdk(f"model_{MODEL}"))
            assert stack.starts() == ["rig-a", "rig-a"]
    finally:
        metadata.httpd.shutdown()
    assert metadata.calls == ["Google"]  # cached while it is valid


def test_a_token_source_that_fails_is_named_at_once(tmp_path: Path) -> None:
    with Stack(tmp_path, Faults(op_delay=0.1), token={"file": str(tmp_path / "absent")}) as stack:
        with pytest.raises(openai.InternalServerError, match="absent"):
            chat(stack.sdk().with_options(timeout=8))  # a hang would be the SDK's timeout error
        assert stack.starts() == []


def test_a_connection_reset_is_one_journal_line_not_a_traceback(stack: Stack) -> None:
    """A peer that resets a kept-alive connection (as HAProxy may) leaves one line in the journal."""
    with socket.create_connection(("127.0.0.1", stack.port)) as conn:
        conn.sendall(b"GET /waker/status HTTP/1.1\r\nHost: x\r\n\r\n")
        conn.recv(65536)
        conn.sendall(b"GET /waker/status HTTP/1.1\r\nHo")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    deadline = time.monotonic() + 5
    while "ended: ConnectionResetError" not in stack.log and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "ended: ConnectionResetError" in stack.log and "Traceback" not in stack.log, stack.log
