"""The gateway's rig-waker (roles/gateway/files/rig-waker) against the fake Compute API, over real HTTP.

Each test runs the waker as the gateway host does (its own process, python3, the JSON configuration
the role renders) in front of stopped fake instances (two, or four), each backed by a fake rig whose
/health answers 200 only a moment after its instance was started (or never, for a broken rig).
What a client hears of a failure is checked against what only the operator may read (Stack.inside). The fake API checks the waker's token
against the four permissions docs/gateway.md gives its service account. HAProxy is left out: the
waker is called as HAProxy's backup server calls it, with the backend in X-Gemma-Rig-Backend.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.conftest import ROOT
from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_rig import FakeRig

WAKER = ROOT / "roles" / "gateway" / "files" / "rig-waker"
MODEL = "tiny-emb4"
PROJECT = "p1"
ZONES = {"rig-a": "us-central1-a", "rig-b": "us-central1-b"}
TOKEN = "waker-token-0123"  # a test-only token


def waker_roles() -> dict[str, list[str]]:
    """The custom roles roles/gce makes for rig-waker (vars/main.yml), by the variable naming each
    one's id: the permissions the waker's account holds, and the only ones its token here has."""
    roles = yaml.safe_load((ROOT / "roles/gce/vars/main.yml").read_text())["_gce_waker_roles"]
    return {role["id"].strip("{} "): role["permissions"] for role in roles}


MINIMAL = {permission for permissions in waker_roles().values() for permission in permissions}


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


class NeverHealthy(RigBehindVm):
    """A VM that starts but whose vLLM never answers /health 200 (a bad swap, a load that fails)."""

    def start(self) -> None:
        self.on = True


class Stack:
    """The fake API, fake rigs (two unless ``zones`` names more) behind stopped instances, and the
    waker in front; ``broken`` rigs never get healthy; ``settings`` go over the waker's own."""

    def __init__(
        self,
        tmp: Path,
        faults: Faults,
        token: dict | None = None,
        zones: dict[str, str] | None = None,
        broken: frozenset[str] = frozenset(),
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.tmp = tmp
        self.token = token
        self.zones = zones or ZONES
        self.broken = broken
        self.settings = settings or {}
        self.fake = FakeComputeServer(faults, permissions={TOKEN: set(MINIMAL)})
        self.rigs = {name: FakeRig(MODEL, stream_pause=0.05) for name in self.zones}
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
                "zone": self.zones[n],
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
                "be_default": list(self.rigs),
                f"model_{MODEL}": list(self.rigs),
                "model_x": [],
            },
            **self.settings,
        }

    def __enter__(self) -> Stack:
        self.fake.start()
        for name, rig in self.rigs.items():
            rig.__enter__()
            vm = NeverHealthy(rig) if name in self.broken else RigBehindVm(rig)
            self.fake.api.seed_instance(PROJECT, self.zones[name], name, vm)
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

    def statuses(self) -> dict[str, str]:
        """Each instance's status as the fake API has it."""
        return {n: self.fake.api.instances[(z, n)]["status"] for n, z in self.zones.items()}

    def ask(self, backend: str = "be_default") -> httpx.Response:
        """One chat request as HAProxy's backup server hands it over (no retries)."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        return httpx.post(
            self.url + "/v1/chat/completions", json=body, headers={"X-Gemma-Rig-Backend": backend}, timeout=60
        )

    def lines_of(self, request: str) -> list[str]:
        """The journal's lines for one request id."""
        return [line for line in self.log.splitlines() if line.startswith(f"request {request}: ")]

    def waker_status(self) -> dict[str, Any]:
        answer = httpx.get(self.url + "/waker/status", timeout=5)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def inside(self) -> list[str]:
        """What only the operator may read: the project, zones, rig and instance names, backend
        names, and words of the API's messages (IAM, stockout, resource paths)."""
        return [PROJECT, *self.zones.values(), *self.rigs, *self.config()["backends"], "backend", "projects/",
                "compute.", "permission", "Required", "ZONE_RESOURCE", "resources", "instances"]  # fmt: skip

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
        wakes = stack.waker_status()["wakes"]
        assert wakes["rig-a"]["outcome"] == "start failed" and wakes["rig-b"]["outcome"] == "healthy"
        assert "ZONE_RESOURCE_POOL_EXHAUSTED" in wakes["rig-a"]["detail"]
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in stack.log


ID = re.compile(r"\(request id ([0-9a-f]{16})\)")


def generic(answer: httpx.Response | openai.APIStatusError, status: int, stack: Stack) -> str:
    """The request id of a generic error in vLLM's shape that names nothing of the inside."""
    response = answer if isinstance(answer, httpx.Response) else answer.response
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    seen = response.text + "".join(f"{k}: {v}\n" for k, v in response.headers.items())
    assert [word for word in stack.inside() if word in seen] == [], seen
    found = ID.search(error["message"])
    assert found, error["message"]
    return found.group(1)


def test_when_no_rig_can_start_the_client_hears_it_at_once_and_the_journal_why(tmp_path: Path) -> None:
    with Stack(tmp_path, Faults(op_delay=0.1, stockout_zones=set(ZONES.values()))) as stack:
        # A hang would be the SDK's timeout error (8 s for all three tries), not the waker's answer.
        with pytest.raises(openai.InternalServerError) as caught:
            chat(stack.sdk().with_options(timeout=8))  # the SDK's 2 retries included
        last = generic(caught.value, 500, stack)
        assert stack.starts() == ["rig-a", "rig-b"]  # the retries started nothing more
        first, *retries = re.findall(r"^request ([0-9a-f]{16}): POST ", stack.log, re.M)
        assert len(retries) == 2 and retries[-1] == last
        (line,) = stack.lines_of(first)
        assert "rig rig-a: start failed: stockout in us-central1-a" in line
        assert "rig rig-b: start failed: stockout in us-central1-b" in line
        assert "ZONE_RESOURCE_POOL_EXHAUSTED" in line and f"projects/{PROJECT}/zones/" in line
        for retry in retries:  # the failure memory: the cause and the first request's id, no start
            (line,) = stack.lines_of(retry)
            assert f"refused without a start: the wake of be_default for request {first} failed" in line
            assert "ZONE_RESOURCE_POOL_EXHAUSTED" in line
        # A backend no rig serves: the same kind of answer, nothing started.
        answer = stack.ask("model_x")
        request = generic(answer, 500, stack)
        assert answer.json()["error"]["message"].startswith("no rig serves the model of this request")
        assert stack.lines_of(request) == [f"request {request}: POST '/v1/chat/completions' (model_x): "
                                           "no rig serves backend model_x"]  # fmt: skip
        assert stack.starts() == ["rig-a", "rig-b"]


def test_the_docs_name_the_permissions_the_playbooks_grant() -> None:
    """docs/gateway.md's list of rig-waker's permissions, and each `gcloud iam roles create` of its
    by-hand equivalent, are the roles roles/gce makes: neither is written apart from the other."""
    text = (ROOT / "docs/gateway.md").read_text()
    paragraph = text.split("**Its permissions on Compute Engine**", 1)[1].split("\n\n", 1)[0]
    assert set(re.findall(r"`(compute\.[A-Za-z.]+)`", paragraph)) == MINIMAL
    assert f"are {['one', 'two', 'three', 'four', 'five', 'six'][len(MINIMAL) - 1]}," in paragraph
    defaults = yaml.safe_load((ROOT / "roles/gce/defaults/main.yml").read_text())
    by_hand = dict(re.findall(r"gcloud iam roles create (\w+) .*?--permissions=([\w.,]+)", text, re.S))
    assert {defaults[var]: sorted(perms) for var, perms in waker_roles().items()} == {
        role: sorted(perms.split(",")) for role, perms in by_hand.items()
    }


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


def test_a_token_without_start_is_named_in_the_journal_and_never_to_the_client(tmp_path: Path) -> None:
    """The API's 403 names the project, zone, instance and permission: the journal has it, the
    client only an id. A 403 is a start refused: the next rig is tried (and refused too)."""
    with Stack(tmp_path, Faults(op_delay=0.1)) as stack:
        (tmp_path / "token").write_text("read-only\n")  # read on each call: a rotated file is used at once
        stack.fake.httpd.RequestHandlerClass.permissions["read-only"] = {"compute.instances.get"}
        request = generic(stack.ask(), 500, stack)
        (line,) = stack.lines_of(request)
        assert (
            f"rig rig-a: start failed: instances.start refused: POST projects/{PROJECT}/zones/"
            f"{ZONES['rig-a']}/instances/rig-a/start: HTTP 403 forbidden: Required "
            f"'compute.instances.start' permission for 'projects/{PROJECT}/zones/{ZONES['rig-a']}/instances/rig-a'"
        ) in line
        assert "rig rig-b: start failed: instances.start refused" in line
        assert stack.starts() == ["rig-a", "rig-b"]  # both asked, both refused
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
        with pytest.raises(openai.InternalServerError) as caught:
            chat(stack.sdk().with_options(timeout=8))  # a hang would be the SDK's timeout error
        request = generic(caught.value, 500, stack)
        assert "absent" in stack.lines_of(request)[0]
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


FOUR = {
    "rig-a": "us-central1-a",
    "rig-b": "us-central1-b",
    "rig-c": "us-central1-c",
    "rig-d": "us-central1-f",
}


def load_program(path: Path, name: str) -> Any:
    """A program of the gateway role (a Python file with no .py) as the module ``name``."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_ctl() -> Any:
    """gateway-ctl as a module (the gateway host runs it as a program)."""
    return load_program(ROOT / "roles" / "gateway" / "files" / "gateway-ctl", "gateway_ctl")


def test_a_rig_that_never_gets_healthy_ends_the_wake_and_is_named(tmp_path: Path) -> None:
    """Four rigs, the first of which starts and never answers /health: one request starts it and
    nothing else; the client hears an id, the journal and the status name the rig and why."""
    settings = {"timeout": 3, "failure_memory": 0}
    with Stack(
        tmp_path, Faults(op_delay=0.1), zones=FOUR, broken=frozenset({"rig-a"}), settings=settings
    ) as stack:
        request = generic(stack.ask(), 500, stack)  # answered: the wake is over
        assert stack.starts() == ["rig-a"]
        assert stack.statuses() == {"rig-a": "RUNNING", "rig-b": "TERMINATED", "rig-c": "TERMINATED",
                                    "rig-d": "TERMINATED"}  # fmt: skip
        (line,) = stack.lines_of(request)
        assert "rig rig-a: never healthy: its /health did not answer 200 before the deadline (3 s)" in line
        assert f"wake be_default (request {request}): rig rig-a: never healthy: " in stack.log
        wake = stack.waker_status()["wakes"]
        assert set(wake) == {"rig-a"}
        assert wake["rig-a"]["outcome"] == "never healthy" and wake["rig-a"]["request"] == request
        assert wake["rig-a"]["started"] is True and "/health did not answer 200" in wake["rig-a"]["detail"]
        said = load_ctl().waker_view(str(tmp_path / "waker.json"))
        assert said["rig-a"]["wake"].startswith(f"never healthy (request {request}, ")
        assert said["rig-a"]["wake"].endswith("its /health did not answer 200 before the deadline (3 s)")


def test_the_next_wake_starts_another_rig_than_the_one_never_healthy(tmp_path: Path) -> None:
    """A later wake tries the backend's other rigs first: one broken rig does not keep its model
    unserved, and that wake too starts one rig."""
    settings = {"timeout": 3, "failure_memory": 0}
    with Stack(
        tmp_path, Faults(op_delay=0.1), zones=FOUR, broken=frozenset({"rig-a"}), settings=settings
    ) as stack:
        generic(stack.ask(), 500, stack)
        assert stack.starts() == ["rig-a"]
        answer = stack.ask()
        assert answer.status_code == 200, answer.text
        assert stack.starts() == ["rig-a", "rig-b"]
        assert [e["path"] for e in stack.rigs["rig-b"].log if e["path"] != "/health"] == [
            "/v1/chat/completions"
        ]
        wakes = stack.waker_status()["wakes"]
        assert wakes["rig-a"]["outcome"] == "never healthy" and wakes["rig-b"]["outcome"] == "healthy"
        assert wakes["rig-b"]["summary"].startswith("started at ")


def test_a_spent_deadline_sends_no_start(tmp_path: Path) -> None:
    with Stack(tmp_path, Faults(op_delay=0.1), settings={"timeout": 0}) as stack:
        request = generic(stack.ask(), 500, stack)  # answered: the wake is over
        (line,) = stack.lines_of(request)
        assert "rig rig-a: not started: the wake's 0 s were spent before its start was sent" in line
        assert "rig-b" not in line  # nor tried
        assert stack.starts() == [] and set(stack.statuses().values()) == {"TERMINATED"}
        assert stack.waker_status()["wakes"]["rig-a"]["outcome"] == "not started"


class MuteRig:
    """A rig whose /health answers 200 and which drops every other request unanswered."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                self.close_connection = True  # no answer at all

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


def test_a_rig_that_does_not_answer_is_named_in_the_journal_only(tmp_path: Path) -> None:
    mute = MuteRig()

    class MuteStack(Stack):
        def config(self) -> dict:
            config = super().config()
            config["rigs"].append({"name": "rig-mute", "address": "127.0.0.1", "port": mute.port,
                                   "project": PROJECT, "zone": ZONES["rig-a"], "instance": "rig-mute"})  # fmt: skip
            config["backends"]["model_mute"] = ["rig-mute"]
            return config

        def inside(self) -> list[str]:
            return [*super().inside(), "rig-mute", "mute"]

    try:
        with MuteStack(tmp_path, Faults(op_delay=0.1)) as stack:
            answer = stack.ask("model_mute")
            request = generic(answer, 502, stack)
            assert answer.json()["error"]["message"].startswith("the rig for this request did not answer")
            assert f"request {request}: forward to rig rig-mute failed: " in stack.log
            assert stack.starts() == []
    finally:
        mute.httpd.shutdown()


class Refusing:
    """The Compute API of two stopped instances, ia and ib: ib's start succeeds, ia's ends in
    ``fault``: an HTTP status on instances.start, no answer to it, or an operation error code."""

    def __init__(self, module: Any, fault: tuple[str, Any]) -> None:
        self.module, self.fault = module, fault
        self.calls: list[str] = []
        self.status: dict[str, str] = {}

    def call(
        self, method: str, path: str, query: dict[str, str] | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        instance = path.split("/instances/", 1)[1].split("/")[0]
        self.calls.append(f"{method} {instance}{'/start' if path.endswith('/start') else ''}")
        if method == "GET":
            return {"status": self.status.get(instance, "TERMINATED"), "id": "1"}
        kind, value = self.fault
        if instance == "ia" and kind == "http":
            raise self.module.ApiError(f"POST {path}: HTTP {value} some reason: some message", value)
        if instance == "ia" and kind == "lost":
            raise self.module.WakeError(f"POST {path}: TimeoutError: timed out")
        if instance == "ia" and kind == "op":
            return {"status": "DONE", "name": "op-1", "error": {"errors": [{"code": value, "message": "no"}]}}
        self.status[instance] = "RUNNING"
        return {"status": "DONE", "name": "op-1"}


def waker_of_two(fault: tuple[str, Any]) -> tuple[Any, Any, Refusing]:
    from tests.unit.test_spot_recovery import load_waker

    module = load_waker()
    rigs = [{"name": n, "address": "127.0.0.1", "port": 9, "project": "p", "zone": "z", "instance": f"i{n}"}
            for n in ("a", "b")]  # fmt: skip
    waker = module.Waker({"api": "http://127.0.0.1:9", "token": {"file": "/dev/null"}, "rigs": rigs,
                          "backends": {"be": ["a", "b"]}, "poll": 0, "timeout": 30})  # fmt: skip
    compute = waker.compute = Refusing(module, fault)
    for name in ("a", "b"):
        waker.rigs[name].healthy = lambda name=name: compute.status.get(f"i{name}") == "RUNNING"
    return module, waker, compute


@pytest.mark.parametrize(
    "fault",
    [("http", 403), ("http", 429), ("op", "QUOTA_EXCEEDED"), ("op", "ZONE_RESOURCE_POOL_EXHAUSTED")],
    ids=["403", "429", "quota", "stockout"],
)
def test_a_start_the_api_refused_or_failed_gives_way_to_the_next_rig(fault: tuple[str, Any]) -> None:
    _, waker, compute = waker_of_two(fault)
    assert waker.rig_for("be", "r1") is waker.rigs["b"]
    assert [c for c in compute.calls if c.startswith("POST")] == ["POST ia/start", "POST ib/start"]
    assert waker.wakes["a"]["outcome"] == "start failed" and waker.wakes["b"]["outcome"] == "healthy"


@pytest.mark.parametrize("fault", [("http", 503), ("lost", None)], ids=["503", "no-answer"])
def test_a_start_that_may_have_run_ends_the_wake(fault: tuple[str, Any]) -> None:
    """The API took the start or may have: the next rig is not started for the same request."""
    module, waker, compute = waker_of_two(fault)
    with pytest.raises(module.WakeError, match="whether it started is not known"):
        waker.rig_for("be", "r1")
    assert [c for c in compute.calls if c.startswith("POST")] == ["POST ia/start"]
    assert waker.wakes["a"]["outcome"] == "never healthy" and "b" not in waker.wakes


class Late:
    """A Compute API that answers ``slow`` (GET or POST) only after ``pause`` seconds; a start's
    operation is still running when it is answered."""

    def __init__(self, slow: str, pause: float) -> None:
        self.slow, self.pause = slow, pause
        self.calls: list[str] = []

    def call(
        self, method: str, path: str, query: dict[str, str] | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        self.calls.append(f"{method} {path.rsplit('/', 1)[-1]}")
        if method == self.slow:
            time.sleep(self.pause)
        if method == "GET":
            return {"status": "TERMINATED"}
        # A waker that polled past the deadline would poll for ever: the third poll ends it.
        return {"status": "DONE" if len(self.calls) > 4 else "RUNNING", "name": "op-1"}


@pytest.mark.parametrize("slow", ["GET", "POST"])
def test_nothing_is_sent_past_the_deadline(slow: str) -> None:
    """GET answered after the deadline: no instances.start. The start answered after it: no wait
    on its operation (the rig may be running: never healthy, not a start to move on from)."""
    from tests.unit.test_spot_recovery import load_waker

    module = load_waker()
    rig = {"name": "r", "address": "127.0.0.1", "port": 9, "project": "p", "zone": "z", "instance": "r"}
    waker = module.Waker({"api": "http://127.0.0.1:9", "token": {"file": "/dev/null"}, "rigs": [rig],
                          "backends": {"b": ["r"]}, "timeout": 0.05})  # fmt: skip
    compute = waker.compute = Late(slow, pause=0.2)  # sleeps at least this: past the deadline
    with pytest.raises(module.WakeError) as caught:
        waker._start(waker.rigs["r"], time.monotonic() + 0.05)
    if slow == "GET":
        assert isinstance(caught.value, module.DeadlineSpent) and compute.calls == ["GET r"]
    else:
        assert not isinstance(caught.value, module.NotStarted)
        assert str(caught.value) == "instances.start of r did not finish in time"
        assert compute.calls == ["GET r", "POST start"]


def test_a_journal_line_stays_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A cause quotes the API's text: a newline in it never makes a line of its own."""
    from tests.unit.test_spot_recovery import load_waker

    load_waker().log("cause: line one\nrequest 0000000000000000: forged\r\x1b[2J")
    assert capsys.readouterr().err == "cause: line one\\x0arequest 0000000000000000: forged\\x0d\\x1b[2J\n"
