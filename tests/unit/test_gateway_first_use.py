"""A gateway with no client key: a first-use key on a local loopback gateway, a refusal elsewhere.

gateway_api_keys empty used to render an empty key map: gateway.yml ended green and every request
got 401. Now gateway.yml's first play runs the role's `first_use` entry point before anything is
made: on a local gateway bound to loopback it makes a key on the controller (0600, once, reused)
that the gateway takes as client `first-use` while gateway_api_keys is empty, and gateway.yml's last
play prints its path and curl commands that work as pasted from the project root, never the key;
any other gateway fails in one line naming gateway_api_keys and the vault.

As in tests/unit/test_gateway_config.py, the role's tasks run on the controller (gateway files in a
temporary directory, gateway_service_manage false) and the real HAProxy serves what they rendered,
in front of a fake rig; gateway.yml's own last play runs as written, read from the playbook.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT, VENV_BIN
from tests.fake_rig import FakeRig
from tests.secret_watch import CmdlineSampler

GATEWAY_YML = ROOT / "playbooks" / "gateway.yml"
KEY_SHAPE = re.compile(r"sk-gw-[A-Za-z0-9_-]{44}\n")
ALICE = "sk-gw-unit-alice-0123456789abcdef"  # a test-only key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inventory(tmp: Path, rigs: dict | None = None, **gateway: object) -> Path:
    """An inventory with the project's group_vars, a local-connection gateway `gw` (its files under
    ``tmp``, the project root ``tmp`` too: build/ is ``tmp/build``) with ``gateway``'s variables, and
    ``rigs``."""
    where = tmp / "inventory"
    if not where.exists():
        (where / "group_vars").mkdir(parents=True)
        (where / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    host = {
        **local,
        "rig_project_dir": str(tmp),
        "gateway_service_manage": False,
        "gateway_config_dir": str(tmp / "etc"),
        "gateway_admin_socket": str(tmp / "admin.sock"),
        **gateway,
    }
    hosts = {"gateways": {"hosts": {"gw": host}}, "rigs": {"hosts": rigs or {}}}
    (where / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return where


def role_play(tmp: Path, *entry_points: str) -> Path:
    """The role's entry points in order, then gateway.yml's last play as the playbook has it."""
    tasks = [
        {"name": name, "ansible.builtin.include_role": {"name": "gateway", "tasks_from": name}}
        for name in entry_points
    ]
    plays = [{"hosts": "gateways", "gather_facts": False, "tasks": tasks}]
    last = yaml.safe_load(GATEWAY_YML.read_text())[-1]
    assert last["name"] == "Say how to use the first-use key", last["name"]
    play = tmp / "play.yml"
    play.write_text(json.dumps([*plays, last]))
    return play


@dataclass
class FirstUse:
    """The gateway the role rendered with no client key, its runs, and what watched them."""

    tmp: Path
    rig: FakeRig
    rig_host: dict
    port: int
    metrics_port: int
    runs: list[PlaybookRun]
    sampler: CmdlineSampler

    @property
    def key_file(self) -> Path:
        return self.tmp / "build" / "gateway" / "gw-first-use.key"

    @property
    def cert(self) -> Path:
        return self.tmp / "build" / "gateway" / "gw.crt"

    def run(
        self, *args: str, entry_points: tuple[str, ...] = ("first_use", "tls", "config"), **gateway: object
    ) -> PlaybookRun:
        hosts = inventory(self.tmp, {"rig": self.rig_host}, **{**self.gateway_vars, **gateway})
        run = run_playbook(str(role_play(self.tmp, *entry_points)), *args, inventory=hosts)
        assert run.rc == 0, run.output[-6000:]
        return run

    @property
    def gateway_vars(self) -> dict:
        return {
            "gateway_platform": "local",
            "gateway_bind_address": "127.0.0.1",
            "gateway_address": "127.0.0.1",
            "gateway_port": self.port,
            "gateway_metrics_port": self.metrics_port,
        }


@pytest.fixture(scope="module")
def first_use(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstUse]:
    assert shutil.which("haproxy") and shutil.which("curl"), "run scripts/setup.sh"
    tmp = tmp_path_factory.mktemp("first-use")
    with FakeRig("tiny-emb4", alias="tiny-gemma-4") as rig:
        env = tmp / "rig.env"
        env.write_text(
            "RIG_MODEL_KEY=tiny-emb4\nRIG_SERVED_MODEL_NAME=tiny-emb4\nRIG_SERVED_ALIAS=tiny-gemma-4\n"
        )
        # The rig: a host of group rigs on a local connection, its tpu.env here.
        rig_host = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python"),
                    "rig_env_file": str(env), "rig_port": rig.port}  # fmt: skip
        done = FirstUse(tmp, rig, rig_host, free_port(), free_port(), [], CmdlineSampler([]))
        # Every command line while the key is made: the key is not known before, so all are kept.
        with CmdlineSampler([]) as sampler:
            done.runs.append(done.run())
        done.sampler = sampler
        done.runs.append(done.run("-vvv"))  # a second run, verbose: reuses the key
        proc = subprocess.Popen(
            ["haproxy", "-db", "-f", str(tmp / "etc" / "haproxy.cfg")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", done.port)) == 0:
                        break
                time.sleep(0.1)
            yield done
        finally:
            proc.terminate()
            proc.communicate(timeout=10)


def test_the_key_is_made_once_0600_and_reused(first_use: FirstUse) -> None:
    first, second = first_use.runs
    key = first_use.key_file.read_text()
    assert KEY_SHAPE.fullmatch(key), "the first-use key is not sk-gw- and 44 url-safe characters"
    assert first_use.key_file.stat().st_mode & 0o777 == 0o600
    assert first.total("changed") > 0
    # The second run found it and made nothing: the same key, the same map, nothing changed.
    assert second.total("changed") == 0, second.output[-6000:]
    assert first_use.key_file.read_text() == key


def test_haproxy_takes_it_as_client_first_use(first_use: FirstUse) -> None:
    key = first_use.key_file.read_text().strip()
    keys_map = (first_use.tmp / "etc" / "gemma-gateway" / "api-keys.map").read_text()
    assert f"{hashlib.sha256(f'Bearer {key}'.encode()).hexdigest()} first-use\n" in keys_map
    assert key not in keys_map
    # Its one client: no empty key (which would let "Bearer " in) beside it.
    assert [line for line in keys_map.splitlines() if line and not line.startswith("#")] == [
        f"{hashlib.sha256(f'Bearer {key}'.encode()).hexdigest()} first-use"
    ]
    url = f"https://127.0.0.1:{first_use.port}"
    context = ssl.create_default_context(cafile=str(first_use.cert))
    with httpx.Client(base_url=url, verify=context, timeout=30) as client:
        assert client.get("/v1/models").status_code == 401
        ok = client.post(
            "/v1/chat/completions", json={"messages": []}, headers={"Authorization": f"Bearer {key}"}
        )
        assert ok.status_code == 200, ok.text
    assert any(entry["path"] == "/v1/chat/completions" for entry in first_use.rig.log)  # the rig answered


def test_the_printed_commands_work_as_pasted_from_the_project_root(first_use: FirstUse) -> None:
    said = first_use.runs[-1].output
    assert "build/gateway/gw-first-use.key (client first-use)" in said
    commands = [line.strip() for line in said.splitlines() if line.strip().startswith("curl --cacert build/")]
    assert len(commands) == 2, said[-4000:]
    answers = []
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=first_use.tmp,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        answers.append(json.loads(done.stdout))
    assert answers[0]["object"] == "list" and answers[1]["choices"], answers


def test_the_key_never_shows(first_use: FirstUse) -> None:
    key = first_use.key_file.read_text().strip()
    for run in first_use.runs:
        assert key not in run.output
    assert first_use.sampler.rounds > 0 and first_use.sampler.saw("ansible-playbook")
    assert not first_use.sampler.saw(key)  # never an argument of any process


def test_keys_you_set_replace_it(first_use: FirstUse, tmp_path: Path) -> None:
    """With gateway_api_keys set, the first-use key is no longer a client, and nothing is printed."""
    secrets = tmp_path / "secrets.json"
    secrets.touch(mode=0o600)
    secrets.write_text(json.dumps({"gateway_api_keys": {"alice": ALICE}}))
    try:
        run = first_use.run("-e", f"@{secrets}")
        keys_map = (first_use.tmp / "etc" / "gemma-gateway" / "api-keys.map").read_text()
        clients = [line.split()[1] for line in keys_map.splitlines() if line and not line.startswith("#")]
        assert clients == ["alice"]
        assert "takes the first-use key" not in run.output and "curl --cacert" not in run.output
    finally:
        first_use.run()  # back to the first-use key, for any test after this one


def test_no_key_file_is_no_client(first_use: FirstUse) -> None:
    """The configuration rendered again (swap.yml renders it) when the first-use key is not there (build/
    removed): no client at all, never an empty key."""
    try:
        first_use.run(entry_points=("config",), gateway_first_use_key_file=str(first_use.tmp / "gone.key"))
        keys_map = (first_use.tmp / "etc" / "gemma-gateway" / "api-keys.map").read_text()
        assert [line for line in keys_map.splitlines() if line and not line.startswith("#")] == []
    finally:
        first_use.run(entry_points=("config",))


def test_query_yml_asks_with_it(first_use: FirstUse) -> None:
    """gateway_client_api_key (query.yml -e via_gateway=true) is the first-use key while no key is set."""
    check = {
        "ansible.builtin.assert": {
            "that": [
                "gateway_client_api_key | length > 0",
                "gateway_client_api_key == lookup('ansible.builtin.file', gateway_first_use_key_file)",
            ],
            "quiet": True,
        }
    }
    play = first_use.tmp / "client.yml"
    play.write_text(json.dumps([{"hosts": "gateways", "gather_facts": False, "tasks": [check]}]))
    hosts = inventory(first_use.tmp, {"rig": first_use.rig_host}, **first_use.gateway_vars)
    run = run_playbook(str(play), inventory=hosts, timeout=120)
    assert run.rc == 0, run.output[-3000:]
    assert first_use.key_file.read_text().strip() not in run.output


def refuse(tmp: Path, **gateway: object) -> PlaybookRun:
    hosts = inventory(tmp, gateway_controller_dir=str(tmp / "ctl"), **gateway)
    run = run_playbook(str(role_play(tmp, "first_use", "tls", "config")), inventory=hosts, timeout=120)
    assert run.rc != 0
    return run


def assert_refused_in_one_line(run: PlaybookRun) -> None:
    """The refusal is one line naming gateway_api_keys and the vault, and the first task that did
    anything: before it only the entry point's inclusion and its argument check."""
    lines = [line for line in run.output.splitlines() if "no client key: set gateway_api_keys" in line]
    assert lines and "ansible-vault" in lines[0] and "vault.yml" in lines[0], run.output[-3000:]
    tasks = re.findall(r"^TASK \[(.*?)\]", run.output, re.MULTILINE)
    assert (
        len(tasks) == 3 and tasks[-1] == "gateway : Refuse a gateway for other machines without client keys"
    ), tasks
    assert run.total("changed") == 0 and run.total("failed") == 1


@pytest.mark.parametrize(
    "gateway",
    [
        {"gateway_platform": "local", "gateway_bind_address": "0.0.0.0"},
        {"gateway_platform": "", "gateway_bind_address": "127.0.0.1"},  # a host you have, over SSH
        {"gateway_platform": "gce", "gateway_bind_address": "0.0.0.0"},
    ],
    ids=["local-open", "ssh-host", "gce"],
)
def test_a_gateway_for_other_machines_refuses_before_writing(tmp_path: Path, gateway: dict) -> None:
    run = refuse(tmp_path, **gateway)
    assert_refused_in_one_line(run)
    assert not (tmp_path / "ctl").exists() and not (tmp_path / "etc").exists()


def test_gateway_yml_refuses_first_on_compute_engine(tmp_path: Path) -> None:
    """The example gce inventory with no keys: gateway.yml stops at its first task, before the VM's
    provisioning asks anything (the API endpoint given answers nothing, were it asked)."""
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({
        "gateway_api_keys": {}, "gce_api_endpoint": "http://127.0.0.1:9", "gce_auth_kind": "anonymous",
        "rig_controller_build_dir": str(tmp_path / "build"),
    }))  # fmt: skip
    run = run_playbook("gateway.yml", "-i", "inventory/gateway-gce.yml", "-e", f"@{extra}", timeout=120)
    assert run.rc != 0
    assert_refused_in_one_line(run)
    assert "Provision the VM" not in run.output and not (tmp_path / "build").exists()


def test_gateway_yml_checks_the_keys_before_it_provisions() -> None:
    """The local container is made in gateway.yml's first play: the key check comes before it."""
    first = yaml.safe_load(GATEWAY_YML.read_text())[0]
    steps = [task.get("ansible.builtin.include_role", {}) for task in first["tasks"]]
    assert steps[0] == {"name": "gateway", "tasks_from": "first_use"}
    assert steps[1]["name"] == "local_rig"
