"""Wake on request through the real HAProxy: the rendered gateway, rig-waker and the fake Compute API.

The role renders its files for two stopped local rigs (fake rigs behind fake instances, as in
tests/unit/test_rig_waker.py) with gateway_wake on; HAProxy runs that configuration here, and
rig-waker runs from its rendered configuration. A client with the official openai SDK (its default
timeout and retries; only the gateway's certificate is given) asks for one rig's model: that rig,
and only it, is started and answers; once its health check passes HAProxy sends it the next
request itself. Spot recovery: two spot rigs serving one model, one preempted (its port closed, as
a stopped VM's), is started again by the waker while HAProxy serves every request from the other.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.ansible_run import render_gateway
from tests.conftest import ROOT, VENV_BIN
from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_rig import FakeRig
from tests.unit.test_gateway_config import CLIENT_API, EVERY_PATH, others_usage_seen
from tests.unit.test_rig_waker import MINIMAL, RigBehindVm, free_port

KEY = "sk-gw-unit-0123456789abcdef"  # test-only keys
KEY_BOB = "sk-gw-unit-bob-0123456789abcdef"
RIG_KEY = "sk-rig-unit-0123456789abcdef"
TOKEN = "waker-token-0123"
CTL = ROOT / "roles" / "gateway" / "files" / "gateway-ctl"
WAKER = ROOT / "roles" / "gateway" / "files" / "rig-waker"


def wait(condition: object, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class PoweredRig(RigBehindVm):
    """A fake rig whose VM really goes away: stopped, its port refuses connections; started, it listens again."""

    def stop(self) -> None:
        super().stop()
        self.rig.server.shutdown()
        self.rig.server.server_close()

    def start(self) -> None:
        if self.rig.server.socket.fileno() == -1:  # closed by stop(): listen again on the same port
            server = ThreadingHTTPServer(("127.0.0.1", self.rig.port), self.rig.server.RequestHandlerClass)
            server.daemon_threads = True
            self.rig.server = server
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        super().start()


class Stack:
    def __init__(
        self, tmp: Path, models: tuple[str, str] = ("tiny-emb4", "tiny-w8a8"), spot: bool = False
    ) -> None:
        self.tmp = tmp
        self.etc = tmp / "etc"
        self.socket = tmp / "admin.sock"
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.fake = FakeComputeServer(Faults(op_delay=0.2), permissions={TOKEN: set(MINIMAL)})
        self.rigs = {"fake-a": FakeRig(models[0]), "fake-b": FakeRig(models[1])}
        self.spot = spot
        self.procs: list[subprocess.Popen[str]] = []

    def render(self) -> None:
        inventory = self.tmp / "inventory"
        (inventory / "group_vars").mkdir(parents=True)
        (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
        local = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
        hosts: dict = {"rigs": {"hosts": {}}, "gateways": {"hosts": {}}}
        for name, rig in self.rigs.items():
            env = self.tmp / f"{name}.env"
            env.write_text(f"RIG_MODEL_KEY={rig.model}\nRIG_SERVED_MODEL_NAME={rig.model}\n")
            hosts["rigs"]["hosts"][name] = {**local, "rig_env_file": str(env), "rig_port": rig.port}
            if self.spot:
                hosts["rigs"]["hosts"][name]["gateway_wake_spot"] = True
        hosts["gateways"]["hosts"]["gw"] = {
            **local,
            "gateway_service_manage": False,
            "gateway_config_dir": str(self.etc),
            "gateway_admin_socket": str(self.socket),
            "gateway_controller_dir": str(self.tmp / "ctl"),
            "gateway_bind_address": "127.0.0.1",
            "gateway_address": "127.0.0.1",
            "gateway_port": self.port,
            "gateway_wake": True,
            "gateway_wake_port": free_port(),
            "gateway_metrics_port": free_port(),  # never the local gateway's 8404, up beside in the e2e lane
            "gateway_wake_api": self.fake.endpoint,
        }
        (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
        secrets = {"gateway_api_keys": {"alice": KEY, "bob": KEY_BOB}, "rig_api_key": RIG_KEY,
                   "gateway_wake_token": TOKEN}  # fmt: skip
        run = render_gateway(self.tmp, inventory, secrets)
        assert run.rc == 0, run.output[-6000:]
        assert TOKEN not in run.output and RIG_KEY not in run.output

    def __enter__(self) -> Stack:
        self.fake.start()
        for name, rig in self.rigs.items():
            rig.__enter__()
            self.fake.api.seed_instance(
                "local", "local-a", name, PoweredRig(rig) if self.spot else RigBehindVm(rig)
            )
        self.render()
        config = json.loads((self.etc / "gemma-gateway" / "rig-waker.json").read_text())
        # What systemd's LoadCredential= hands the unit, here the rendered file itself; a short poll.
        config["token"] = {"file": str(self.etc / "gemma-gateway" / "rig-waker.token")}
        config["poll"] = 0.05
        self.rendered = dict(config)
        config["watch"] = 0.2  # a short watch: what the role renders is checked in the tests
        waker_config = self.tmp / "waker.json"
        waker_config.write_text(json.dumps(config))
        self.procs.append(
            subprocess.Popen(
                [sys.executable, str(WAKER), "--config", str(waker_config)], stderr=subprocess.PIPE, text=True
            )
        )
        self.procs.append(
            subprocess.Popen(
                ["haproxy", "-db", "-f", str(self.etc / "haproxy.cfg")],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        wait(lambda: self.socket.exists() and self.listening(self.port), "haproxy")
        wait(lambda: self.listening(config["port"]), "rig-waker")
        return self

    @staticmethod
    def listening(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.communicate(timeout=10)
        for rig in self.rigs.values():
            rig.__exit__(None, None, None)
        self.fake.stop()

    def ctl(self, *args: str) -> str:
        waker = str(self.tmp / "waker.json")
        cmd = [
            str(VENV_BIN / "python"),
            str(CTL),
            "--socket",
            str(self.socket),
            "--waker-config",
            waker,
            *args,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout

    def states(self) -> dict[str, str]:
        return {row["rig"]: row["state"] for row in json.loads(self.ctl("status"))}

    def starts(self) -> list[str]:
        return [r["path"].split("/")[-2] for r in self.fake.api.requests("POST", "/start")]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    assert shutil.which("haproxy"), "haproxy is not installed on the controller: run scripts/setup.sh"
    with Stack(tmp_path) as s:
        yield s


def test_a_request_for_a_stopped_model_starts_its_rig_through_the_gateway(stack: Stack) -> None:
    """alice's request starts its model's rig; bob's key, before and after, on every path outside
    the client API starts nothing (GET /metrics woke a rig once) and reads nothing of alice's."""
    wait(lambda: set(stack.states().values()) == {"DOWN"}, "both rigs DOWN at the gateway")
    assert set(stack.states()) == {"fake-a", "fake-b"}  # gateway-ctl leaves rig-waker out
    cafile = stack.tmp / "ctl" / "gw.crt"
    operational = [pair for pair in EVERY_PATH if pair not in CLIENT_API]
    assert ("GET", "/metrics") in operational
    assert others_usage_seen(stack.url, cafile, KEY_BOB, "alice", operational) == []
    assert stack.starts() == []
    verify = ssl.create_default_context(cafile=str(cafile))
    with httpx.Client(verify=verify) as http:
        assert http.get(stack.url + "/health").status_code == 200  # the waker can answer
        client = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, http_client=http)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny-w8a8", messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.parse().model == "tiny-w8a8" and raw.headers["x-gemma-rig"] == "rig-waker"
        assert stack.starts() == ["fake-b"]  # the model's rig, not the first rig
        wait(lambda: stack.states()["fake-b"] == "UP", "fake-b UP at the gateway")
        raw = client.chat.completions.with_raw_response.create(
            model="tiny-w8a8", messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.headers["x-gemma-rig"] == "fake-b" and stack.starts() == ["fake-b"]
    sent = [e["authorization"] for e in stack.rigs["fake-b"].log if e["path"] != "/health"]
    assert sent == [f"Bearer {RIG_KEY}"] * 2  # the rigs' key through the waker too, never the client's
    assert ("alice", "prompt") in stack.rigs["fake-b"].client_tokens  # the rig up holds her counts
    assert others_usage_seen(stack.url, cafile, KEY_BOB, "alice") == []  # bob on every path, client API too
    assert stack.starts() == ["fake-b"]
    assert stack.fake.api.mismatches == []


def test_a_preempted_spot_rig_is_started_again_while_the_other_serves(tmp_path: Path) -> None:
    assert shutil.which("haproxy"), "haproxy is not installed on the controller: run scripts/setup.sh"
    with Stack(tmp_path, models=("tiny-emb4", "tiny-emb4"), spot=True) as stack:
        assert [r["spot"] for r in stack.rendered["rigs"]] == [True, True] and stack.rendered["watch"] == 30
        for name in stack.rigs:  # both up, started as a user would (not by the waker)
            with stack.fake.api.lock:
                stack.fake.api.instance_action("local", "local-a", name, "start", {})
        wait(lambda: set(stack.states().values()) == {"UP"}, "both rigs UP at the gateway")
        verify = ssl.create_default_context(cafile=str(stack.tmp / "ctl" / "gw.crt"))
        answered: list[str] = []
        failures: list[str] = []
        done = threading.Event()

        def ask() -> None:
            with httpx.Client(verify=verify, timeout=30) as http:
                while not done.is_set():
                    body = {"model": "tiny-emb4", "messages": [{"role": "user", "content": "hi"}]}
                    try:
                        answer = http.post(stack.url + "/v1/chat/completions", json=body,
                                           headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
                    except httpx.HTTPError as exc:
                        failures.append(repr(exc))
                        continue
                    if answer.status_code == 200:
                        answered.append(answer.headers["x-gemma-rig"])
                    else:
                        failures.append(f"{answer.status_code} {answer.text[:200]}")
                    time.sleep(0.02)

        client = threading.Thread(target=ask)
        client.start()
        try:
            wait(lambda: {"fake-a", "fake-b"} <= set(answered), "both rigs answering")
            preempted = httpx.post(f"{stack.fake.endpoint}/fake-admin/zones/local-a/instances/fake-b/preempt")
            assert preempted.status_code == 200
            since = len(answered)
            wait(lambda: stack.starts() == ["fake-b"], "the waker starting fake-b again", timeout=10)
            wait(
                lambda: ", started again at " in stack.ctl("status", "--text"),
                "the recovery done",
                timeout=30,
            )
            wait(lambda: stack.states()["fake-b"] == "UP", "fake-b UP again at the gateway", timeout=30)
            recovered = len(answered)
            wait(lambda: "fake-b" in answered[recovered:], "fake-b answering again")
        finally:
            done.set()
            client.join(30)
        assert failures == [] and "fake-a" in answered[since:]
        assert "rig-waker" not in answered  # the other rig served; nothing waited on a start
        lines = stack.ctl("status", "--text").splitlines()
        line = next(x for x in lines if x.startswith("fake-b: UP"))
        assert "; recovery: preempted at " in line and ", started again at " in line, line
        assert "; last wake: started at " in line and " (recovery), healthy at " in line, line
        line = next(x for x in lines if x.startswith("fake-a"))
        assert "recovery: spot, no preemption seen" in line and "last wake" not in line  # a user started it
        # rig-waker's status is not the gateway's to serve: HAProxy forwards only the rigs' paths.
        with httpx.Client(verify=verify) as http:
            relayed = http.get(stack.url + "/waker/status", headers={"Authorization": f"Bearer {KEY}"})
        assert relayed.status_code == 404 and "path not served" in relayed.text
        assert stack.fake.api.mismatches == []
