"""The gateway's HAProxy configuration, rendered by roles/gateway and run on the controller.

One ansible-playbook run (local connections) renders the role's files for a gateway in front of two
fake rigs (tests/fake_rig.py) serving different models, with the role's own tasks (`tls` makes the
self-signed certificate, `config` reads each rig's tpu.env and renders; its template task runs
`haproxy -c` before a file is written). Then the real HAProxy runs that configuration here, and
clients check what docs/gateway.md promises: the key at the edge (401 without it, never passed
on), the model list, routing by `model`, streams that pass unbuffered, health checks, requests
a dying rig left unanswered sent to the other (and a stream it cut, an error the SDK raises), and
gateway-ctl's drain, route and ready through the runtime API.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.ansible_run import render_gateway, run_playbook
from tests.conftest import ROOT, VENV_BIN
from tests.fake_rig import FakeRig, chat_body, chunk_body

KEY = "sk-gw-unit-0123456789abcdef"  # a test-only key
KEY_BOB = "sk-gw-unit-bob-0123456789abcdef"  # a second client's
RIG_KEY = "sk-rig-unit-0123456789abcdef"
CTL = ROOT / "roles" / "gateway" / "files" / "gateway-ctl"
RIG_VARS = yaml.safe_load((ROOT / "inventory" / "group_vars" / "all" / "rig.yml").read_text())
ALIAS = "tiny-gemma-4"  # the tiny builds' catalog alias: both fake rigs answer to it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """The rendered files, the running HAProxy and a client for it."""

    def __init__(self, tmp: Path, rigs: dict[str, FakeRig], port: int) -> None:
        self.tmp, self.rigs, self.port = tmp, rigs, port
        self.etc = tmp / "etc"
        self.socket = tmp / "admin.sock"
        self.cert = tmp / "ctl" / "gw.crt"
        self.url = f"https://127.0.0.1:{port}"
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(self.etc / "haproxy.cfg")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0 and self.socket.exists():
                    return
            time.sleep(0.1)
        raise AssertionError("haproxy did not start")

    def stop(self) -> str:
        assert self.proc is not None
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return out

    def client(self, key: str | None = KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(
            base_url=self.url,
            verify=ssl.create_default_context(cafile=str(self.cert)),
            headers=headers,
            timeout=30,
        )

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(VENV_BIN / "python"), str(CTL), "--socket", str(self.socket)]
        cmd += list(args)
        return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)

    def status(self) -> dict[str, dict]:
        result = self.ctl("status")
        assert result.returncode == 0, result.stderr
        return {row["rig"]: row for row in json.loads(result.stdout)}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    assert shutil.which("haproxy"), "haproxy is not installed on the controller: run scripts/setup.sh"
    tmp = tmp_path_factory.mktemp("gateway")
    with FakeRig("tiny-emb4", alias=ALIAS) as rig_a, FakeRig("tiny-w8a8", alias=ALIAS) as rig_b:
        rigs = {"fake-a": rig_a, "fake-b": rig_b}
        gw = Gateway(tmp, rigs, free_port())
        inventory = tmp / "inventory"
        (inventory / "group_vars").mkdir(parents=True)
        (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
        local = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
        hosts: dict = {"rigs": {"hosts": {}}, "gateways": {"hosts": {}}}
        for name, rig in rigs.items():
            env = tmp / f"{name}.env"
            env.write_text(
                f"RIG_MODEL_KEY={rig.model}\nRIG_SERVED_MODEL_NAME={rig.model}\nRIG_SERVED_ALIAS={ALIAS}\n"
                f"VLLM_API_KEY={RIG_KEY}\n"
            )
            hosts["rigs"]["hosts"][name] = {**local, "rig_env_file": str(env), "rig_port": rig.port}
        hosts["gateways"]["hosts"]["gw"] = {
            **local,
            "gateway_service_manage": False,
            "gateway_config_dir": str(gw.etc),
            "gateway_admin_socket": str(gw.socket),
            "gateway_controller_dir": str(tmp / "ctl"),
            "gateway_bind_address": "127.0.0.1",
            "gateway_address": "127.0.0.1",
            "gateway_port": gw.port,
            "gateway_metrics_port": gw.metrics_port,
            "gateway_extra_models": ["tiny-w4a16"],
        }
        (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
        secrets = {"gateway_api_keys": {"alice": KEY, "bob": KEY_BOB}, "rig_api_key": RIG_KEY}
        run = render_gateway(tmp, inventory, secrets)
        assert run.rc == 0, run.output[-9000:]
        gw.playbook_output = run.output
        gw.start()
        try:
            yield gw
        finally:
            gw.log = gw.stop()


def test_rendered_files(gateway: Gateway) -> None:
    cfg = (gateway.etc / "haproxy.cfg").read_text()
    check = subprocess.run(
        ["haproxy", "-c", "-f", str(gateway.etc / "haproxy.cfg")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "balance leastconn" in cfg and "option httpchk GET /health" in cfg
    assert "default-server inter 1s fall 2 rise 1" in cfg
    assert "option http-buffer-request" in cfg
    # Retried: what a dying rig leaves unanswered; never a timeout, a 500 or a garbled answer.
    retry = ["retries 2", "retry-on conn-failure empty-response 502 503 504", "option redispatch 1"]
    assert "\n    ".join(retry) in cfg
    # one backend per model: the two served and the extra one, each rig routed only for its own
    for model in ("tiny-emb4", "tiny-w8a8", "tiny-w4a16"):
        assert f"backend model_{model}\n" in cfg
    assert f"backend alias_{ALIAS}\n" in cfg
    assert f"server fake-a 127.0.0.1:{gateway.rigs['fake-a'].port} track be_default/fake-a\n" in cfg
    assert f"server fake-b 127.0.0.1:{gateway.rigs['fake-b'].port} track be_default/fake-b disabled\n" in cfg
    # Routes only for names some rig serves: the extra model gets its entry once a rig is routed there.
    models_map = (gateway.etc / "gemma-gateway" / "models.map").read_text()
    routes = [line for line in models_map.splitlines() if line and not line.startswith("#")]
    assert routes == ["tiny-emb4 model_tiny-emb4", "tiny-w8a8 model_tiny-w8a8", f"{ALIAS} alias_{ALIAS}"]
    keys = (gateway.etc / "gemma-gateway" / "api-keys.map").read_text()
    assert KEY not in keys and " alice" in keys
    for path in gateway.etc.rglob("*"):
        if path.is_file() and path.name != "gateway.crt":
            assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"
    assert KEY not in gateway.playbook_output and RIG_KEY not in gateway.playbook_output


def test_the_key_is_checked_at_the_edge_and_stops_there(gateway: Gateway) -> None:
    with gateway.client(key=None) as anon, gateway.client(key="sk-wrong-key-0000") as wrong:
        assert anon.get("/v1/models").status_code == 401
        response = wrong.post("/v1/chat/completions", json={"model": "tiny-emb4", "messages": []})
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert anon.get("/health").status_code == 200  # the gateway's own health needs no key
    with gateway.client() as client:
        assert (
            client.post("/v1/chat/completions", json={"model": "tiny-emb4", "messages": []}).status_code
            == 200
        )
    sent = [
        entry["authorization"]
        for rig in gateway.rigs.values()
        for entry in rig.log
        if entry["path"] != "/health"
    ]
    assert sent and all(auth == f"Bearer {RIG_KEY}" for auth in sent)  # the rigs' key, never the client's


def test_models_and_routing_by_model(gateway: Gateway) -> None:
    with gateway.client() as client:
        listed = client.get("/v1/models").json()
        assert [m["id"] for m in listed["data"]] == ["tiny-emb4", ALIAS, "tiny-w8a8"]
        for _ in range(4):
            for rig_name, rig in gateway.rigs.items():
                response = client.post("/v1/chat/completions", json={"model": rig.model, "messages": []})
                assert response.status_code == 200, response.text
                assert response.json()["model"] == rig.model
                assert response.headers["x-gemma-rig"] == rig_name
        # no model: any rig, which answers with its own
        answered = {
            client.post("/v1/chat/completions", json={"messages": []}).json()["model"] for _ in range(6)
        }
        assert answered == {"tiny-emb4", "tiny-w8a8"}


def test_streams_pass_unbuffered(gateway: Gateway, figure) -> None:
    """A stream reaches the client as the rig's separate events, whole. How soon the first one
    came, against the rig's pause before the next, is reported, not asserted: a shared machine's
    load moves it (test_each_chunk_is_passed_on_at_once proves each chunk is passed on alone)."""
    pause = gateway.rigs["fake-a"].stream_pause
    body = {"model": "tiny-emb4", "messages": [], "stream": True}
    with gateway.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
        started = time.monotonic()
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        first_at = time.monotonic() - started
        rest = [line for line in lines if line.startswith("data: ")]
        done_at = time.monotonic() - started
    figure(
        "gateway stream: first chunk, whole stream (the rig pauses between them)",
        f"{first_at:.3f} s, {done_at:.3f} s (pause {pause} s)",
    )
    assert json.loads(first[6:])["choices"][0]["delta"]["content"] == "Par"
    # The rig's second token and the stream's last chunk came as events of their own, then [DONE].
    events = [json.loads(line[6:])["choices"][0] for line in rest[:-1]]
    assert [(e["delta"].get("content") or None, e.get("finish_reason")) for e in events] == [
        ("is", None),
        (None, "stop"),
    ], rest
    assert rest[-1] == "data: [DONE]"


def test_each_chunk_is_passed_on_at_once(gateway: Gateway, figure) -> None:
    """A token's chunk reaches the client without waiting for the next one. The rig sends each
    chunk only after the client read the one before (FakeRig.lockstep), so every chunk arriving
    proves the gateway passed it on alone: one that waited for more data would wait for good, and
    the rig would cut the stream after 10 s. How long a hop takes (a proxy's buffer timeout or the
    kernel's corking timer, about 200 ms, would show in every hop) is reported as a figure."""
    rig = gateway.rigs["fake-a"]
    rig.lockstep = threading.Semaphore(0)
    tokens = 12
    hops: list[float] = []
    body = {"model": "tiny-emb4", "messages": [], "stream": True, "max_tokens": tokens}
    try:
        with gateway.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as response:
            last = time.monotonic()
            for line in response.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    now = time.monotonic()
                    hops.append(now - last)
                    last = now
                    rig.lockstep.release()
    finally:
        rig.lockstep = None
    assert len(hops) == tokens, hops
    # The hops after the first (which includes the request's own way in): a held chunk would cost
    # a buffer timeout or the kernel's 200 ms each; a passed one takes about a millisecond here.
    figure(
        "gateway stream: median hop of a chunk, first hop excluded",
        f"{statistics.median(hops[1:]) * 1000:.1f} ms over {tokens - 1} hops",
    )


def test_drain_route_and_ready(gateway: Gateway) -> None:
    ctl = gateway.ctl
    before = gateway.status()
    assert before["fake-a"]["model"] == "tiny-emb4" and before["fake-a"]["state"].startswith("UP")
    result = ctl("drain", "fake-a", "--timeout", "10")
    assert result.returncode == 0, result.stderr
    assert gateway.status()["fake-a"]["state"] == "DRAIN"
    with gateway.client() as client:
        # drained: no new request reaches it, with or without a model
        assert {
            client.post("/v1/chat/completions", json={"messages": []}).json()["model"] for _ in range(4)
        } == {"tiny-w8a8"}
        # no rig takes tiny-emb4 now: its route is gone, and the rig left answers vLLM's 404
        gone = client.post("/v1/chat/completions", json={"model": "tiny-emb4", "messages": []})
        assert (
            gone.status_code == 404
            and gone.json()["error"]["message"] == "The model `tiny-emb4` does not exist."
        )
        assert gone.headers["x-gemma-rig"] == "fake-b"
        # as a swap does: fake-a now serves tiny-w8a8; route it there and put it back
        gateway.rigs["fake-a"].model = "tiny-w8a8"
        for args in (("route", "fake-a", "tiny-w8a8"), ("ready", "fake-a", "--timeout", "10")):
            result = ctl(*args)
            assert result.returncode == 0, result.stderr
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [ALIAS, "tiny-w8a8"]
        rigs = {
            client.post("/v1/chat/completions", json={"model": "tiny-w8a8", "messages": []}).headers[
                "x-gemma-rig"
            ]
            for _ in range(8)
        }
        assert rigs == {"fake-a", "fake-b"}
    after = gateway.status()
    assert after["fake-a"]["model"] == "tiny-w8a8" and after["fake-a"]["state"].startswith("UP")
    # unknown names fail with a message, not a traceback
    assert "no backend for 'nope'" in ctl("route", "fake-a", "nope").stderr
    assert "no rig 'nope'" in ctl("drain", "nope").stderr


def put_back(gateway: Gateway) -> None:
    """Both fake rigs on their own builds and in service (a test before may have moved them)."""
    gateway.rigs["fake-a"].model, gateway.rigs["fake-b"].model = "tiny-emb4", "tiny-w8a8"
    for rig in gateway.rigs.values():
        rig.healthy = True
    for name, rig in gateway.rigs.items():
        result = gateway.ctl("restore", name, rig.model, "--alias", ALIAS, "--timeout", "10")
        assert result.returncode == 0, result.stderr


def test_the_alias_reaches_whichever_build_a_rig_serves(gateway: Gateway) -> None:
    """A client naming the alias is answered while any rig serving one of its builds takes
    requests, through a drain of either; the answer names the build that served it."""
    put_back(gateway)
    body = {"model": ALIAS, "messages": []}
    with gateway.client() as client:
        answered = {
            (r.headers["x-gemma-rig"], r.json()["model"])
            for r in (client.post("/v1/chat/completions", json=body) for _ in range(8))
        }
        assert answered == {("fake-a", "tiny-emb4"), ("fake-b", "tiny-w8a8")}
        assert gateway.ctl("drain", "fake-a", "--timeout", "10").returncode == 0
        during = [client.post("/v1/chat/completions", json=body) for _ in range(4)]
        assert [(r.status_code, r.headers["x-gemma-rig"]) for r in during] == [(200, "fake-b")] * 4
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [ALIAS, "tiny-w8a8"]
    assert gateway.status()["fake-a"]["alias"] == ALIAS and gateway.status()["fake-b"]["alias"] == ALIAS
    put_back(gateway)


def test_restore_puts_back_a_rig_left_drained_and_says_so(gateway: Gateway) -> None:
    """What a dead controller leaves (a rig drained at the gateway) is put back by `restore`, which
    names what it found; on a rig in service it changes nothing and says that too."""
    put_back(gateway)
    assert gateway.ctl("drain", "fake-a", "--timeout", "10").returncode == 0
    restored = gateway.ctl("restore", "fake-a", "tiny-emb4", "--alias", ALIAS, "--timeout", "10")
    assert restored.returncode == 0, restored.stderr
    last = restored.stdout.splitlines()[-1]
    assert last.startswith("fake-a: put back in service for tiny-emb4 (it was: "), last
    assert "be_default DRAIN" in last and "model_tiny-emb4 DRAIN" in last and f"alias_{ALIAS} DRAIN" in last
    assert gateway.status()["fake-a"]["state"].startswith("UP")
    again = gateway.ctl("restore", "fake-a", "tiny-emb4", "--alias", ALIAS, "--timeout", "10")
    assert again.stdout.strip() == "fake-a: in service for tiny-emb4, nothing to restore"
    # Routed for another model than it serves (a swap killed after its switch): routed right again.
    assert gateway.ctl("route", "fake-a", "tiny-w4a16").returncode == 0
    fixed = gateway.ctl("restore", "fake-a", "tiny-emb4", "--alias", ALIAS, "--timeout", "10")
    assert "model_tiny-w4a16 DRAIN" in fixed.stdout and "put back in service for tiny-emb4" in fixed.stdout
    with gateway.client() as client:
        response = client.post("/v1/chat/completions", json={"model": "tiny-emb4", "messages": []})
        assert response.status_code == 200 and response.headers["x-gemma-rig"] == "fake-a"
        # the extra model no rig serves now: no route, so vLLM's own 404
        assert (
            client.post("/v1/chat/completions", json={"model": "tiny-w4a16", "messages": []}).status_code
            == 404
        )
    put_back(gateway)


def test_a_failing_rig_is_taken_out(gateway: Gateway) -> None:
    rig = gateway.rigs["fake-b"]
    rig.healthy = False
    try:
        deadline = time.monotonic() + 5
        while not gateway.status()["fake-b"]["state"].startswith("DOWN"):
            assert time.monotonic() < deadline, gateway.status()
            time.sleep(0.1)
        with gateway.client() as client:
            rigs = {
                client.post("/v1/chat/completions", json={"messages": []}).headers["x-gemma-rig"]
                for _ in range(6)
            }
        assert rigs == {"fake-a"}
    finally:
        rig.healthy = True
    deadline = time.monotonic() + 5
    while not gateway.status()["fake-b"]["state"].startswith("UP"):
        assert time.monotonic() < deadline, gateway.status()
        time.sleep(0.1)


class DyingRig:
    """A rig whose vLLM dies on the request it gets: its /health answers (the checks have not seen
    it die yet), and every other request gets ``reply`` (nothing, a status line, a stream's start),
    then the connection closed, or reset as the kernel resets a killed process's socket."""

    def __init__(self, reply: bytes, reset: bool) -> None:
        self.reply, self.reset, self.hits = reply, reset, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                if not (data := conn.recv(65536)):
                    return
                head += data
            if head.startswith(b"GET /health "):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            self.hits += 1
            conn.sendall(self.reply)
            if self.reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def point_fake_b(gateway: Gateway, backend: str, port: int) -> None:
    """Send fake-b's requests in ``backend`` to ``port`` (the runtime API)."""
    with socket.socket(socket.AF_UNIX) as admin:
        admin.connect(str(gateway.socket))
        admin.sendall(f"set server {backend}/fake-b addr 127.0.0.1 port {port}\n".encode())
        reply = admin.makefile().read()
    assert "port changed" in reply, reply


@contextmanager
def fake_b_replaced(gateway: Gateway, backend: str, rig: DyingRig) -> Iterator[None]:
    """fake-b in ``backend`` is ``rig`` meanwhile."""
    point_fake_b(gateway, backend, rig.port)
    try:
        yield
    finally:
        point_fake_b(gateway, backend, gateway.rigs["fake-b"].port)
        rig.server.close()


def status_only(status: int) -> bytes:
    return f"HTTP/1.1 {status} Dying\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()


@pytest.mark.parametrize(
    "reply,reset,retried",
    [
        (b"", True, True),  # SIGKILL: the request unread, the socket reset
        (b"", False, True),  # the request read, the socket closed
        (status_only(502), False, True),
        (status_only(503), False, True),
        (status_only(504), False, True),
        (status_only(500), False, False),  # the request may be what broke it: not sent to the next
    ],
    ids=["reset", "closed", "502", "503", "504", "500"],
)
def test_a_request_a_dying_rig_left_unanswered_is_answered_by_another(
    gateway: Gateway, reply: bytes, reset: bool, retried: bool
) -> None:
    """Requests with no model (any rig) while fake-b dies on each one it gets: HAProxy sends each
    again to fake-a, and the client sees only fake-a's answers; a 500 is passed on as it is."""
    put_back(gateway)
    dying = DyingRig(reply, reset)
    with fake_b_replaced(gateway, "be_default", dying), gateway.client() as client:
        answers = [client.post("/v1/chat/completions", json={"messages": []}) for _ in range(4)]
    got = [(r.status_code, r.headers.get("x-gemma-rig")) for r in answers]
    assert dying.hits >= 1, got
    if retried:
        assert got == [(200, "fake-a")] * 4
    else:
        assert sorted(got) == sorted([(200, "fake-a")] * (4 - dying.hits) + [(500, "fake-b")] * dying.hits)


def test_a_request_larger_than_the_buffer_is_not_retried(gateway: Gateway) -> None:
    """HAProxy replays only a request it holds whole: one past tune.bufsize (gateway_bufsize) that
    a dying rig leaves unanswered fails (a 502, or the connection closed while the body still went
    in), whichever rigs are up."""
    put_back(gateway)
    dying = DyingRig(b"", reset=True)
    cfg = (gateway.etc / "haproxy.cfg").read_text()
    bufsize = int(cfg.split("tune.bufsize ", 1)[1].split()[0])
    body = {"messages": [{"role": "user", "content": "a" * bufsize}]}
    got = []
    with fake_b_replaced(gateway, "be_default", dying):
        for _ in range(4):
            with gateway.client() as client:
                try:
                    got.append(client.post("/v1/chat/completions", json=body).status_code)
                except httpx.TransportError as exc:  # the body still going in when the rig died
                    got.append(type(exc).__name__)
    assert dying.hits >= 1 and got.count(200) == 4 - dying.hits, got


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_stream_a_dying_rig_cut_is_an_error_the_sdk_raises(gateway: Gateway, reset: bool) -> None:
    """A stream that has begun cannot be replayed: when its rig dies, the official SDK (its own
    defaults, retries included) raises after the events that came, rather than ending the answer
    as if it were whole. HAProxy cuts the client's connection before the chunked body's end."""
    put_back(gateway)
    event = b"data: " + json.dumps(chunk_body("tiny-w8a8", {"content": "Par"})).encode() + b"\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    dying = DyingRig(head + f"{len(event):x}\r\n".encode() + event + b"\r\n", reset)
    http = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(gateway.cert)))
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, http_client=http)
    got = []
    with fake_b_replaced(gateway, "model_tiny-w8a8", dying):
        stream = client.chat.completions.create(
            model="tiny-w8a8", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        with pytest.raises(openai.APIConnectionError) as raised:
            got.extend(stream)
    assert [c.choices[0].delta.content for c in got] == ["Par"]
    cause = raised.value.__cause__
    # httpx's words for a chunked body without its last chunk
    assert type(cause).__name__ == "RemoteProtocolError" and "incomplete chunked read" in str(cause), cause
    assert dying.hits == 1  # neither HAProxy nor the SDK sent it again


def test_the_openai_sdk_streams_through_the_gateway(gateway: Gateway) -> None:
    """The client the e2e load uses: a stream with no model, answered by either rig."""
    http = httpx.Client(verify=ssl.create_default_context(cafile=str(gateway.cert)), timeout=30)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY, max_retries=0, http_client=http)
    raw = client.chat.completions.with_raw_response.create(
        model="", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    chunks = list(raw.parse())
    assert raw.headers["x-gemma-rig"] in gateway.rigs
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert {c.model for c in chunks} == {gateway.rigs[raw.headers["x-gemma-rig"]].model}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{gateway.url}/v1", api_key="sk-wrong", max_retries=0, http_client=http
        ).models.list()


def test_settle_waits_out_a_reload(gateway: Gateway) -> None:
    """swap.yml reloads HAProxy, then `settle` waits until no worker of the older configuration is
    left. Right after the reload the master's socket refuses connections while it re-executes:
    settle asks again rather than failing. Runs HAProxy as the gateway's unit does (master-worker,
    -W -S), then puts the fixture's back."""
    master = gateway.tmp / "master.sock"
    gateway.stop()
    cfg = str(gateway.etc / "haproxy.cfg")
    proc = subprocess.Popen(["haproxy", "-W", "-db", "-S", str(master), "-f", cfg], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not master.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        with gateway.client() as http:
            assert http.get("/v1/models").status_code == 200
        proc.send_signal(signal.SIGUSR2)  # what `systemctl reload haproxy` sends the master
        settled = gateway.ctl("--master-socket", str(master), "settle", "--timeout", "30")
        assert settled.returncode == 0, settled.stderr
        assert settled.stdout.strip() == "no older worker"
        with gateway.client() as http:
            assert http.get("/v1/models").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        gateway.start()


def test_settle_asks_again_when_the_master_drops_the_connection(tmp_path: Path) -> None:
    """The master re-executing after a reload can also take a connection and reset it, or close it
    before it knows its workers (seen in CI). Neither is an answer: settle asks again until the
    worker list has no old worker. The socket here plays those answers in order; the last two are
    `show proc` as HAProxy 2.6 prints it (an old worker, then none)."""
    head = "#<PID>          <type>          <reloads>       <uptime>        <version>\n"
    master_row = "4100            master          1 [failed: 0]   0d00h00m03s     2.6.12\n"
    listed = (
        head
        + master_row
        + "# workers\n4157            worker          0               0d00h00m01s     2.6.12\n"
    )
    with_old = (
        listed + "# old workers\n4121            worker          1               0d00h00m03s     2.6.12\n"
    )
    answers: list[str | None] = [None, "", with_old, listed]  # None: reset the connection
    path = tmp_path / "master.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        for answer in answers:
            conn, _ = server.accept()
            conn.recv(1024)
            if answer is None:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            else:
                conn.sendall(answer.encode())
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        settled = subprocess.run(
            [str(VENV_BIN / "python"), str(CTL), "--master-socket", str(path), "settle", "--timeout", "20"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        thread.join(timeout=10)
    finally:
        server.close()
    assert settled.returncode == 0, settled.stderr
    assert settled.stdout.strip() == "no older worker"
    assert not thread.is_alive(), "settle stopped before the worker list had no old worker"


def raw_answer(url: str, cafile: Path, method: str, target: str, key: str | None) -> bytes:
    """One request with its target sent byte for byte; the whole answer, head and body."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(cafile))
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    head += f"Authorization: Bearer {key}\r\n" if key else ""
    head += (
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        if method == "POST"
        else "\r\n"
    )
    with (
        socket.create_connection((host, int(port)), timeout=60) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(head.encode() + (body if method == "POST" else b""))
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
    return reply


def _raw_request(gateway: Gateway, method: str, target: str, key: str | None = KEY) -> int:
    """One request with its target sent byte for byte (httpx would resolve `..`); returns its status."""
    return int(raw_answer(gateway.url, gateway.cert, method, target, key).split(b" ", 2)[1])


# Paths vLLM 0.29.0 serves beside the documented ones (/invocations runs a chat without a key), and
# spellings of them that a path-normalising hop would turn into one.
HOSTILE_TARGETS = [
    ("POST", "/invocations"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/version"),
    ("GET", "/load"),
    ("POST", "/v1/../tokenize"),
    ("POST", "//invocations"),
    ("POST", "/v1/chat/completions/../../invocations"),
    ("POST", "/v1/chat/completions/%2e%2e/%2e%2e/invocations"),
    ("POST", "/v1/%2E%2E/tokenize"),
    ("POST", "/v1/chat/completions/"),
    ("POST", "/v1/chat%2Fcompletions"),
    ("GET", "/v1/chat/completions"),
    ("POST", "http://127.0.0.1/invocations"),
    ("GET", "/metrics/"),
]


@pytest.mark.parametrize("method,target", HOSTILE_TARGETS)
def test_undocumented_paths_never_reach_a_rig(gateway: Gateway, method: str, target: str) -> None:
    before = sum(len(rig.log) for rig in gateway.rigs.values())
    assert _raw_request(gateway, method, target) == 404  # with a good key: not served here
    assert _raw_request(gateway, method, target, key=None) == 401  # without: the key first
    seen = [
        entry["path"]
        for rig in gateway.rigs.values()
        for entry in rig.log[before:]
        if entry["path"] != "/health"
    ]
    assert not seen, f"{method} {target} reached a rig as {seen}"


# Every path a client could try for another client's usage: the rigs' served paths (GET /metrics
# among them), the gateway's and rig-waker's own operational paths, and spellings of /metrics.
OPERATIONAL_PATHS = [
    "/metrics", "/usage", "/waker/status", "/waker/metrics", "/stats", "/health", "/server_info",
    "/metrics/", "//metrics", "/v1/../metrics", "/v1/%2e%2e/metrics", "/%6detrics", "/METRICS",
    "/metrics?format=prometheus", "/v1/metrics", "/v1/usage",
]  # fmt: skip
EVERY_PATH = sorted(
    {(m, t) for m in ("GET", "POST") for t in OPERATIONAL_PATHS}
    | {tuple(p.split(":", 1)) for p in RIG_VARS["rig_served_paths"]}
    | set(HOSTILE_TARGETS)
)


CLIENT_API = {("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models")}


def others_usage_seen(
    url: str, cafile: Path, key: str, other: str, paths: list[tuple[str, str]] = EVERY_PATH
) -> list[str]:
    """Each (method, path) whose answer to ``key`` names client ``other`` or any client's counts."""
    leaks = []
    for method, target in paths:
        reply = raw_answer(url, cafile, method, target, key)
        if other.encode() in reply or b"gemma_rig_client_tokens" in reply:
            leaks.append(f"{method} {target}: {reply[:300]!r}")
    return leaks


def test_one_clients_key_reaches_no_other_clients_usage(gateway: Gateway) -> None:
    """bob's key, on every path, never sees alice's name or counts; /metrics never reaches a rig."""
    with gateway.client(KEY) as alice:
        assert (
            alice.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
            ).status_code
            == 200
        )
    # What a rig's own metrics hold (the guard's per-client series): alice is named there.
    direct = [
        httpx.get(f"http://127.0.0.1:{rig.port}/metrics", timeout=10).text for rig in gateway.rigs.values()
    ]
    assert any('client="alice"' in text for text in direct), direct
    before = {name: len(rig.log) for name, rig in gateway.rigs.items()}
    assert others_usage_seen(gateway.url, gateway.cert, KEY_BOB, "alice") == []
    assert raw_answer(gateway.url, gateway.cert, "GET", "/metrics", KEY_BOB).startswith(b"HTTP/1.1 404")
    reached = {e["path"] for n, r in gateway.rigs.items() for e in r.log[before[n] :]} - {"/health"}
    assert reached == {"/v1/chat/completions", "/v1/completions"}, reached  # only the client API


def test_the_client_api_passes_and_nothing_else(gateway: Gateway) -> None:
    assert _raw_request(gateway, "GET", "/metrics", key=None) == 401  # the key first
    assert _raw_request(gateway, "GET", "/metrics") == 404
    assert _raw_request(gateway, "POST", "/v1/chat/completions") == 200
    assert _raw_request(gateway, "POST", "/v1/completions") == 200
    assert _raw_request(gateway, "GET", "/v1/models") == 200  # the gateway's own answer
    assert "GET:/metrics" in RIG_VARS["rig_served_paths"]  # the rigs serve it, to Prometheus only


def test_a_forwarded_path_outside_the_client_api_is_refused(tmp_path: Path) -> None:
    """gateway_forwarded_paths with GET:/metrics (or any path outside /v1/): one line, nothing written."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    env = tmp_path / "rig.env"
    env.write_text("RIG_MODEL_KEY=tiny-emb4\nRIG_SERVED_MODEL_NAME=tiny-emb4\n")
    etc = tmp_path / "etc"
    hosts = {
        "rigs": {"hosts": {"fake-a": {**local, "rig_env_file": str(env), "rig_port": free_port()}}},
        "gateways": {"hosts": {"gw": {**local, "gateway_service_manage": False, "gateway_config_dir": str(etc),
                                      "gateway_controller_dir": str(tmp_path / "ctl"), "gateway_address": "127.0.0.1",
                                      "gateway_forwarded_paths": ["POST:/v1/chat/completions", "GET:/metrics"]}}},
    }  # fmt: skip
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    run = render_gateway(tmp_path, inventory, {"gateway_api_keys": {"alice": KEY}})
    assert run.rc != 0
    assert "gateway_forwarded_paths must be GET:/v1/path or POST:/v1/path" in run.output, run.output[-3000:]
    assert not (etc / "haproxy.cfg").exists()


def usage(gateway: Gateway) -> dict[tuple[str, str], int]:
    """GET /usage on the metrics frontend, as {(client, code): count}; checks the text's shape."""
    reply = httpx.get(f"http://127.0.0.1:{gateway.metrics_port}/usage", timeout=10)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    counts = {}
    for line in reply.text.splitlines():
        if line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, labels = head.split("{", 1)
        assert name == "gemma_gateway_client_requests_total", line
        pairs = dict(part.split("=", 1) for part in labels.rstrip("}").split(","))
        counts[(json.loads(pairs["client"]), json.loads(pairs["code"]))] = int(value)
    return counts


def delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def set_rigs(gateway: Gateway, state: str) -> None:
    """Every rig in ``state`` (maint, ready) in be_default, which the named backends track."""
    for name in gateway.rigs:
        with socket.socket(socket.AF_UNIX) as admin:
            admin.connect(str(gateway.socket))
            admin.sendall(f"set server be_default/{name} state {state}\n".encode())
            assert admin.makefile().read().strip() == "", name


def test_requests_are_counted_per_client_and_status_haproxys_own_answers_too(gateway: Gateway) -> None:
    put_back(gateway)
    before = usage(gateway)
    body = {"messages": []}
    with gateway.client() as alice, gateway.client(key=KEY_BOB) as bob, gateway.client(key=None) as anon:
        assert [alice.post("/v1/chat/completions", json=body).status_code for _ in range(3)] == [200] * 3
        assert bob.post("/v1/completions", json=body).status_code == 200
        assert bob.post("/v1/chat/completions", json={"model": "nope", "messages": []}).status_code == 404
        assert bob.post("/tokenize", json=body).status_code == 404  # the gateway's own 404
        assert anon.post("/v1/chat/completions", json=body).status_code == 401
        with gateway.client(key="sk-wrong-key-0000") as wrong:
            assert wrong.get("/v1/models").status_code == 401
        set_rigs(gateway, "maint")
        try:
            assert alice.post("/v1/chat/completions", json=body).status_code == 503  # no rig up
        finally:
            set_rigs(gateway, "ready")
    assert delta(usage(gateway), before) == {
        ("alice", "200"): 3,
        ("alice", "503"): 1,
        ("bob", "200"): 1,
        ("bob", "404"): 2,
        ("-", "401"): 2,
    }


def test_the_counts_stay_exact_across_haproxys_threads(gateway: Gateway) -> None:
    """Requests in parallel on HAProxy's threads (one Lua state behind its lock): none is lost."""
    promex = httpx.get(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=10).text
    threads = next(x for x in promex.splitlines() if x.startswith("haproxy_process_nbthread "))
    assert int(threads.split()[1]) >= 2, threads
    before = usage(gateway)

    def hammer(key: str) -> list[int]:
        with gateway.client(key=key) as client:
            return [client.get("/v1/models").status_code for _ in range(25)]

    keys = [KEY, KEY_BOB, "sk-wrong-key-0000", KEY] * 2
    with ThreadPoolExecutor(len(keys)) as pool:
        codes = [c for batch in pool.map(hammer, keys) for c in batch]
    assert codes.count(200) == 150 and codes.count(401) == 50
    assert delta(usage(gateway), before) == {("alice", "200"): 100, ("bob", "200"): 50, ("-", "401"): 50}


def frontend_errors(gateway: Gateway) -> float:
    """promex's count of the gateway frontend's bad requests."""
    text = httpx.get(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=10).text
    line = next(
        x for x in text.splitlines() if x.startswith('haproxy_frontend_request_errors_total{proxy="gateway"}')
    )
    return float(line.rsplit(" ", 1)[1])


def test_a_request_haproxy_cannot_parse_is_no_clients_but_the_frontends_error(gateway: Gateway) -> None:
    """A request HAProxy cannot parse is answered 400 before any rule runs (no client, no
    http-after-response): /usage does not see it, promex's frontend error count does."""
    before, errors = usage(gateway), frontend_errors(gateway)
    context = ssl.create_default_context(cafile=str(gateway.cert))
    with (
        socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        assert tls.recv(100).startswith(b"HTTP/1.1 400")
    assert delta(usage(gateway), before) == {}
    assert frontend_errors(gateway) == errors + 1


def test_the_metrics_frontend_is_loopback_only_and_serves_two_paths(gateway: Gateway) -> None:
    cfg = (gateway.etc / "haproxy.cfg").read_text()
    binds = [line.split()[1] for line in cfg.splitlines() if line.strip().startswith("bind ")]
    assert f"127.0.0.1:{gateway.metrics_port}" in binds and len(binds) == 2, binds
    base = f"http://127.0.0.1:{gateway.metrics_port}"
    promex = httpx.get(f"{base}/metrics", timeout=10)
    assert promex.status_code == 200 and "haproxy_process_nbthread" in promex.text
    assert 'haproxy_server_status{proxy="be_default",server="fake-a"' in promex.text
    for method, path in [("GET", "/"), ("GET", "/usage/"), ("POST", "/usage"), ("GET", "/stats"),
                         ("GET", "/Usage"), ("DELETE", "/metrics")]:  # fmt: skip
        assert httpx.request(method, f"{base}{path}", timeout=10).status_code == 404, (method, path)
    # Not on the gateway's public port, with or without a key.
    with gateway.client() as client:
        assert client.get("/usage").status_code == 404


class RecordingRig:
    """A rig that answers every request 200 and keeps each request's headers (raw, in order)."""

    def __init__(self) -> None:
        self.headers: list[list[tuple[str, str]]] = []
        rig = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                if self.path != "/health":
                    rig.headers.append(list(self.headers.items()))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                data = json.dumps(chat_body("tiny-w8a8")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()


@pytest.mark.parametrize(
    "sent",
    [
        [("X-Gemma-Rig-Client", "bob")],
        [("x-gemma-rig-client", "admin"), ("X-Gemma-Rig-Client", "alice, bob")],
        [("X-GEMMA-RIG-CLIENT", "")],
        [],
    ],
    ids=["another-name", "two-headers", "empty", "none"],
)
def test_the_rig_hears_the_clients_name_from_the_gateway_only(gateway: Gateway, sent: list) -> None:
    """Whatever X-Gemma-Rig-Client a client sends, the rig gets exactly one: its key's name."""
    put_back(gateway)
    rig = RecordingRig()
    point_fake_b(gateway, "model_tiny-w8a8", rig.port)
    try:
        context = ssl.create_default_context(cafile=str(gateway.cert))
        body = json.dumps({"model": "tiny-w8a8", "messages": []}).encode()
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in sent)
        head += f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}\r\n\r\n"
        with (
            socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(head.encode() + body)
            assert tls.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        point_fake_b(gateway, "model_tiny-w8a8", gateway.rigs["fake-b"].port)
        rig.server.shutdown()
        rig.server.server_close()
    assert len(rig.headers) == 1
    names = [v for k, v in rig.headers[0] if k.lower() == "x-gemma-rig-client"]
    assert names == ["alice"], rig.headers[0]


@pytest.mark.parametrize(
    "name", ['al"ice', "direct", "a b", "-", "x" * 65], ids=["quote", "reserved", "space", "dash", "long"]
)
def test_a_client_name_that_is_no_plain_word_stops_the_config(tmp_path: Path, name: str) -> None:
    """A client's name becomes a header and a label: the role refuses anything but a plain word,
    and the rigs' own words for requests that did not come through it, before it writes a file."""
    play = tmp_path / "play.yml"
    task = {"name": "Config", "ansible.builtin.include_role": {"name": "gateway", "tasks_from": "config"}}
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    secrets = tmp_path / "secrets.json"
    secrets.write_text(
        json.dumps({"gateway_api_keys": {name: KEY}, "gateway_config_dir": str(tmp_path / "etc")})
    )
    run = run_playbook(str(play), "-e", f"@{secrets}", timeout=120)
    assert run.rc != 0 and "every client's name must match" in run.output, run.output[-3000:]
    assert not (tmp_path / "etc").exists()
