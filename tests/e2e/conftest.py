"""The local rig, stood up once per session from nothing by site.yml and shared by e2e tests.

Test files run in name order: test_00_site (bring-up, re-run, check mode), then the tests that
use the running rig, then test_99_teardown. Each file declares the rig state it starts from
(`RIG_START`), and `rig_start` checks it before the file's first test: no file silently depends on
what the one before it left.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT
from tests.e2e.rig import (
    assert_closed,
    assert_serving,
    podman,
    rig_containers,
    served_build,
    served_models,
)
from tests.molecule_run import release_early

CONTAINER = "gemma-rig"
PORT = 8000
MODEL = "tiny-emb4"

# The start states a file can declare in `RIG_START` (CONTRIBUTING.md, "Skips and the e2e order").
NONE = "none"  # no expectation: the file stands the rig up (test_00) or removes it (test_99)
DEFAULT = "default"  # as site.yml leaves it: active, serving tiny-emb4 (checked at the source), closed
# As test_20 hands the two-rig fleet to test_25: rig-local active and closed, serving tiny-emb4
# (checked at the source); rig-b, when up, serving the same.
FLEET = "fleet"
FLEET_MODELS = (MODEL,)
START_STATES = (NONE, DEFAULT, FLEET)

# The second local rig (rig-b, container gemma-rig-b on 8001), layered on the default inventory so
# inventory/group_vars applies to it too.
FLEET_INVENTORY = ("-i", "inventory/local.yml", "-i", str(Path(__file__).with_name("fleet.yml")))


@dataclass
class LocalRig:
    """What the e2e tests know about the rig site.yml stood up."""

    container: str
    port: int
    model: str
    bring_up: PlaybookRun


@pytest.fixture(scope="session")
def local_rig() -> LocalRig:
    """Stand up the local rig from no container at all, with plain `ansible-playbook site.yml`.

    RIG_E2E_REUSE=1 keeps a rig that is already there (site.yml then only converges it): for a
    developer's inner loop, never for CI.
    """
    if not os.environ.get("RIG_E2E_REUSE"):
        for name in rig_containers():
            podman("rm", "-f", name)
        podman("volume", "rm", "-f", f"{CONTAINER}-data")
        assert CONTAINER not in rig_containers()
    run = run_playbook("site.yml")
    release_early()  # the molecule scenarios' downloads and installs no longer contend with it
    assert run.rc == 0, run.output[-6000:]
    return LocalRig(CONTAINER, PORT, MODEL, run)


@pytest.fixture(scope="session")
def fleet(local_rig: LocalRig):
    """rig-b beside rig-local, stood up by site.yml (rig-local is left alone): shared by test_20 and
    test_25, which hands it back. Removed at the end of the session if a file left it up."""
    run = run_playbook("site.yml", *FLEET_INVENTORY)
    assert run.rc == 0, run.output[-6000:]
    yield run
    if "gemma-rig-b" in rig_containers():
        down = run_playbook("teardown.yml", "-l", "rig-b", *FLEET_INVENTORY)
        assert down.rc == 0, down.output[-4000:]


# The gateway in front of the fleet (test_25, then test_26), and its clients: test-only keys.
GATEWAY_INVENTORY = (*FLEET_INVENTORY, "-i", str(ROOT / "inventory" / "gateway-local.yml"))
GATEWAY_CLIENTS = {"e2e": "sk-gw-e2e-0123456789abcdef", "e2e-b": "sk-gw-e2e-b-0123456789abcdef"}
GATEWAY_CONTAINER = "gemma-gateway"  # inventory/gateway-local.yml's ansible_host


@dataclass
class AlertReceiver:
    """A webhook receiver on the controller's loopback: Alertmanager's notifications, as they came."""

    url: str
    received: list[dict] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def firing(self, alertname: str, **labels: str) -> list[dict]:
        """The firing alerts named ``alertname`` with ``labels`` received so far."""
        with self.arrived:
            return [
                alert
                for message in self.received
                for alert in message.get("alerts", [])
                if alert.get("status") == "firing"
                and alert.get("labels", {}).get("alertname") == alertname
                and all(alert.get("labels", {}).get(k) == v for k, v in labels.items())
            ]

    def wait_firing(self, alertname: str, seconds: float, **labels: str) -> list[dict]:
        """Block until such an alert arrives or ``seconds`` pass; what arrived."""
        with self.arrived:
            self.arrived.wait_for(lambda: self.firing(alertname, **labels), timeout=seconds)
            return self.firing(alertname, **labels)


@pytest.fixture(scope="session")
def alert_receiver():
    """The local receiver the gateway's Alertmanager posts to (the gateway shares this host's network)."""
    receiver: AlertReceiver

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with receiver.arrived:
                receiver.received.append(json.loads(body or b"{}"))
                receiver.arrived.notify_all()
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = AlertReceiver(f"http://127.0.0.1:{server.server_address[1]}/alerts")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    server.shutdown()


@pytest.fixture(scope="session")
def gateway(fleet, alert_receiver: AlertReceiver, tmp_path_factory: pytest.TempPathFactory):
    """The gateway (with its monitoring) in front of rig-local and rig-b: stood up by test_25, handed
    to test_26. The last of them in the session takes it down (`gateway_down` in its module
    fixture): a session fixture's own teardown would run after test_99 took every rig away.

    Stood up as docs/gateway.md's first use says, from no gateway container: the one command
    `site.yml gateway.yml` (both playbooks in one ansible-playbook run), whose site.yml ends in
    playbooks/gateway_restore.yml before gateway.yml has made the container."""
    if GATEWAY_CONTAINER in rig_containers():
        podman("rm", "-f", GATEWAY_CONTAINER)
    assert GATEWAY_CONTAINER not in rig_containers()
    keys = tmp_path_factory.mktemp("gateway") / "keys.json"
    keys.touch(mode=0o600)
    keys.write_text(
        json.dumps({"gateway_api_keys": GATEWAY_CLIENTS, "monitoring_alert_webhook_url": alert_receiver.url})
    )
    run = run_playbook("site.yml", "gateway.yml", *GATEWAY_INVENTORY, "-e", f"@{keys}")
    assert run.rc == 0, run.output[-6000:]
    # Through both: site.yml's last play left the missing gateway to gateway.yml, which made it.
    said = " ".join(run.output.split())  # the callback may fold a long line
    assert "gateway-local is not up yet: left to gateway.yml" in said, run.output[-6000:]
    assert "PLAY [Set up the gateway in front of the rigs]" in run.output, run.output[-6000:]
    assert run.total("failed") == 0 and run.total("unreachable") == 0
    assert GATEWAY_CONTAINER in rig_containers()
    return keys, run


def gateway_down(rig: LocalRig, keep_rig_b: bool = False) -> None:
    """The gateway removed and rig-b too, or with ``keep_rig_b`` only stopped (its "VM" powered off:
    test_98 starts it again through the fake Compute API); rig-local back on its build: the state
    the next files expect."""
    gone = {"gemma-gateway"} if keep_rig_b else {"gemma-rig-b", "gemma-gateway"}
    if gone & set(rig_containers()):
        hosts = "gateway-local" if keep_rig_b else "rig-b,gateway-local"
        down = run_playbook("teardown.yml", "-l", hosts, *GATEWAY_INVENTORY)
        assert down.rc == 0, down.output[-4000:]
    assert not gone & set(rig_containers())
    if keep_rig_b:
        assert podman("stop", "gemma-rig-b").returncode == 0
    if served_build(rig.port) != rig.model:  # the rolling swap went away from it
        back = run_playbook("swap.yml", "-e", f"model={rig.model}")
        assert back.rc == 0, back.output[-4000:]
    assert_serving(rig.container, rig.port, rig.model)


def runs_later(request: pytest.FixtureRequest, module: str) -> bool:
    """Whether a file named ``module`` runs later in this session (it takes over what is up)."""
    return any(item.module.__name__.endswith(module) for item in request.session.items)


def hands_over_the_fleet(request: pytest.FixtureRequest) -> bool:
    """Whether test_25 runs later in this session: then test_20 leaves the fleet up for it."""
    return runs_later(request, "test_25_gateway")


@pytest.fixture(scope="module", autouse=True)
def rig_start(request: pytest.FixtureRequest) -> None:
    """Check, before a file's first test, the rig state the file declares in RIG_START."""
    start = getattr(request.module, "RIG_START", None)
    assert start in START_STATES, f"{request.module.__name__} declares no RIG_START (one of {START_STATES})"
    if start == NONE:
        return
    rig: LocalRig = request.getfixturevalue("local_rig")
    if start == FLEET:
        served = served_models(rig.port)
        assert served and served[0] in FLEET_MODELS, (
            f"rig-local serves {served}, expected one of {FLEET_MODELS}"
        )
        assert_serving(rig.container, rig.port, served[0])
        if "gemma-rig-b" in rig_containers():
            assert_serving("gemma-rig-b", 8001, served[0])
    else:
        assert_serving(rig.container, rig.port, rig.model)
    assert_closed(rig.container)


@pytest.fixture
def broken_catalog(tmp_path: Path, local_rig: LocalRig) -> Path:
    """The catalog plus `tiny-broken`: a checkpoint whose config no longer matches its weights."""
    good = ROOT / "build" / "models" / local_rig.model
    broken = tmp_path / "tiny-broken"
    shutil.copytree(good, broken)
    config = json.loads((broken / "config.json").read_text())
    text = config.get("text_config", config)
    text["hidden_size"] = text["hidden_size"] * 2  # every weight now has the wrong shape
    (broken / "config.json").write_text(json.dumps(config, indent=2))
    catalog = yaml.safe_load((ROOT / "inventory/group_vars/all/models.yml").read_text())
    catalog["rig_models"]["tiny-broken"] = {
        "description": "deliberately broken: hidden_size doubled",
        "source": {"kind": "dir", "path": str(broken)},
        "vllm_args": [],
        "size_bytes": 1,
    }
    path = tmp_path / "catalog.yml"
    path.write_text(yaml.safe_dump({"rig_models": catalog["rig_models"]}))
    return path
