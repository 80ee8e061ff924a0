"""The gateway with a rig behind it stopped (roles/gateway: tasks/served.yml, recorded.yml).

A stopped rig (idle auto-stop) cannot be read, so the gateway routes it as it last did: the model
and alias in the record config.yml writes beside haproxy.cfg. Here rig-b is really unreachable
(SSH to a closed port on 127.0.0.1: the connection is refused at once), rig-a is read as usual.
The role's `tls` and `config` tasks run on the controller, rendering files only
(gateway_service_manage: false), as tests/unit/test_gateway_wake_config.py runs them.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import PlaybookRun, render_gateway, run_playbook
from tests.conftest import ROOT, VENV_BIN

KEY = "sk-gw-unit-0123456789abcdef"  # a test-only key
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}


def closed_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gateway_dir(tmp: Path, name: str) -> Path:
    """Where gateway ``name`` renders: tmp itself for ``gw``, else tmp/NAME."""
    return tmp if name == "gw" else tmp / name


def gateway_vars(where: Path) -> dict:
    """A gateway rendering files only, under ``where``."""
    return {
        **LOCAL,
        "gateway_service_manage": False,
        "gateway_config_dir": str(where / "etc"),
        "gateway_admin_socket": str(where / "admin.sock"),
        "gateway_controller_dir": str(where / "ctl"),
        "gateway_address": "127.0.0.1",
    }


def write_inventory(tmp: Path, rig_b_up: bool, gateways: tuple[str, ...] = ("gw",)) -> Path:
    """Gateway ``gw`` (rendering files under tmp/etc) in front of rig-a (up) and rig-b; return its path.

    With other ``gateways`` named, each renders under its own tmp/NAME/etc, beside the others.
    """
    inventory = tmp / "inventory"
    if not inventory.exists():
        (inventory / "group_vars").mkdir(parents=True)
        (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    env_a, env_b = tmp / "a.env", tmp / "b.env"
    env_a.write_text("RIG_SERVED_MODEL_NAME=emb4\nRIG_SERVED_ALIAS=gemma\n")
    env_b.write_text("RIG_SERVED_MODEL_NAME=w8a8\nRIG_SERVED_ALIAS=gemma\n")
    stopped = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": closed_port(),
               "ansible_user": "nobody"}  # fmt: skip
    hosts = {
        "rigs": {
            "hosts": {
                "rig-a": {**LOCAL, "rig_env_file": str(env_a)},
                "rig-b": {**(LOCAL if rig_b_up else stopped), "rig_env_file": str(env_b), "rig_port": 8001},
            }
        },
        "gateways": {"hosts": {name: gateway_vars(gateway_dir(tmp, name)) for name in gateways}},
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inventory


def render(tmp: Path, rig_b_up: bool, *args: str) -> PlaybookRun:
    """Run the gateway's tls and config tasks on ``gw``."""
    inventory = write_inventory(tmp, rig_b_up)
    return render_gateway(tmp, inventory, {"gateway_api_keys": {"alice": KEY}}, *args, timeout=120)


def record_path(tmp: Path) -> Path:
    return tmp / "etc" / "gemma-gateway" / "routes.json"


def backend(cfg: str, name: str) -> str:
    """One backend's section of haproxy.cfg."""
    return cfg.split(f"\nbackend {name}\n", 1)[1].split("\nbackend ", 1)[0]


def test_a_stopped_rig_is_routed_as_the_record_says_and_named(tmp_path: Path) -> None:
    # Check mode writes no record; a real run writes what it routes.
    assert render(tmp_path, True, "--check").rc == 0 and not record_path(tmp_path).exists()
    first = render(tmp_path, True)
    assert first.rc == 0, first.output[-4000:]
    recorded = {
        "rig-a": {"model": "emb4", "alias": "gemma", "address": "127.0.0.1", "port": 8000},
        "rig-b": {"model": "w8a8", "alias": "gemma", "address": "127.0.0.1", "port": 8001},
    }
    assert json.loads(record_path(tmp_path).read_text()) == recorded
    assert record_path(tmp_path).stat().st_mode & 0o077 == 0
    (tmp_path / "etc" / "haproxy.cfg").unlink()  # rendered anew from the record below
    (tmp_path / "b.env").unlink()  # nothing of rig-b can be read now

    run = render(tmp_path, False)
    out = " ".join(run.output.split())
    assert run.rc == 0, run.output[-4000:]
    assert (
        "rig-b is not reachable (stopped?): routing it to w8a8 (alias gemma) as the gateway last did" in out
    )
    assert "rig-a is not reachable" not in out
    cfg = (tmp_path / "etc" / "haproxy.cfg").read_text()
    assert "server rig-b 127.0.0.1:8001 check" in backend(cfg, "be_default")
    # In service for the recorded model and alias only (the others keep it in maintenance).
    assert "server rig-b 127.0.0.1:8001 track be_default/rig-b\n" in backend(cfg, "model_w8a8")
    assert "server rig-b 127.0.0.1:8001 track be_default/rig-b\n" in backend(cfg, "alias_gemma")
    assert "server rig-b 127.0.0.1:8001 track be_default/rig-b disabled\n" in backend(cfg, "model_emb4")
    models = (tmp_path / "etc" / "gemma-gateway" / "models.map").read_text()
    assert "w8a8 model_w8a8" in models and "emb4 model_emb4" in models
    assert json.loads(record_path(tmp_path).read_text()) == recorded  # the same routes kept
    assert run.total("changed", ["gw"]) == 1  # haproxy.cfg alone; the record and maps are as they were


MARKER = "/tmp/gemma-rig-record-marker"
GOOD = {"model": "w8a8", "alias": "gemma", "address": "127.0.0.1", "port": 8001}


HOSTILE = [
    ({"rig-b": {**GOOD, "model": "x\n  server evil 1.2.3.4:80"}}, "is not a plain model name and alias"),
    ({"rig-b": {**GOOD, "model": "w8a8\n"}}, "is not a plain model name and alias"),
    ({"rig-b": {**GOOD, "model": f"{{{{ lookup('pipe', 'touch {MARKER}') }}}}"}}, "is not a plain model"),
    ({"rig-b": {**GOOD, "alias": "{{ 7 * 7 }}"}}, "is not a plain model name and alias"),
    ({"rig-b": {**GOOD, "alias": None}}, "is not a plain model name and alias"),
    ({"rig-b": {**GOOD, "model": ["w8a8"]}}, "is not a plain model name and alias"),
    ({"rig-b": {**GOOD, "model": {"name": "w8a8"}}}, "is not a plain model name and alias"),
    ({"rig-b": "w8a8"}, "is not a plain model name and alias"),
    ({"rig-b": {"alias": "gemma"}}, "is not a plain model name and alias"),
    ([{"rig-b": GOOD}], "is not a JSON object of rig names"),
    ('"w8a8"', "is not a JSON object of rig names"),  # a JSON string
    ('{"rig-b": {"model": "w8a8"', "is not JSON"),
    ("model: w8a8", "is not JSON"),
]
HOSTILE_GATEWAYS = tuple(f"gw{index}" for index in range(len(HOSTILE)))
NO_RECORD = "gw-new"  # a gateway that has never routed: no record at all


def record_text(record: object) -> str:
    """A record's file text: a string is the file's text as it is."""
    return record if isinstance(record, str) else json.dumps(record)


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PlaybookRun]:
    """One run with a gateway per hostile record (gw0, gw1, ...: each its own files, one record
    each) and one with no record (NO_RECORD), all in front of the stopped rig-b: each gateway fails
    or renders on its own, so each refusal is its gateway's, as if it ran alone (ansible goes on
    with the other hosts)."""
    tmp = tmp_path_factory.mktemp("hostile")
    Path(MARKER).unlink(missing_ok=True)
    for name, (record, _) in zip(HOSTILE_GATEWAYS, HOSTILE, strict=True):
        record_path(gateway_dir(tmp, name)).parent.mkdir(parents=True)
        record_path(gateway_dir(tmp, name)).write_text(record_text(record))
    inventory = write_inventory(tmp, False, (*HOSTILE_GATEWAYS, NO_RECORD))
    return tmp, render_gateway(tmp, inventory, {"gateway_api_keys": {"alice": KEY}}, timeout=300)


def failure(output: str, host: str) -> str:
    """The last failure ansible printed for ``host`` (its header and indented result: the one
    that stopped it, after any a rescue caught), whitespace joined; empty when there is none."""
    lines = output.splitlines()
    header = f"fatal: [{host}]: FAILED!"
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    if not starts:
        return ""
    block = [lines[starts[-1]]]
    for line in lines[starts[-1] + 1 :]:
        if line and not line[0].isspace():
            break
        block.append(line)
    return " ".join(" ".join(block).split())


@pytest.mark.parametrize(("index", "refusal"), [(i, refusal) for i, (_, refusal) in enumerate(HOSTILE)])
def test_a_hostile_record_renders_nothing(
    stopped_run: tuple[Path, PlaybookRun], index: int, refusal: str
) -> None:
    tmp, run = stopped_run
    host = HOSTILE_GATEWAYS[index]
    where = gateway_dir(tmp, host)
    out = failure(run.output, host)
    assert run.rc == 2, run.output[-3000:]
    assert run.recap[host]["failed"] == 1, run.recap
    assert refusal in out and "refusing to route" in out, run.output[-3000:]
    assert str(record_path(where)) in out  # its own record named, not another gateway's
    assert "Start rig-b (or run site.yml)" in out
    assert not Path(MARKER).exists()  # never templated
    assert not (where / "etc" / "haproxy.cfg").exists()
    assert not (where / "etc" / "gemma-gateway" / "models.map").exists()
    assert record_path(where).read_text() == record_text(HOSTILE[index][0])  # left as found


def test_a_stopped_rig_the_gateway_never_routed_is_named_with_what_to_do(
    stopped_run: tuple[Path, PlaybookRun],
) -> None:
    tmp, run = stopped_run
    where = gateway_dir(tmp, NO_RECORD)
    out = failure(run.output, NO_RECORD)
    assert run.rc == 2 and run.recap[NO_RECORD]["failed"] == 1, run.output[-3000:]
    assert (
        "rig-b is not reachable (stopped?) and the gateway has no record of what it routes there "
        f"({record_path(where)} on {NO_RECORD}): start rig-b (or run site.yml), then run this again" in out
    ), run.output[-3000:]
    assert not (where / "etc" / "haproxy.cfg").exists()


TOOLS = ROOT / "build" / "prometheus" / "usr" / "bin"


@pytest.mark.skipif(
    not (TOOLS / "promtool").exists(), reason="build/prometheus has no promtool (scripts/setup.sh)"
)
def test_monitoring_scrapes_a_stopped_rig_at_the_gateway_address(tmp_path: Path) -> None:
    """roles/monitoring reads the rigs through served.yml: a stopped rig keeps its scrape target."""
    assert render(tmp_path, True).rc == 0  # the gateway's record of both rigs
    write_inventory(tmp_path, False)  # rig-b stopped
    prom = tmp_path / "etc" / "prometheus"
    settings = {
        "monitoring_service_manage": False,
        "monitoring_config_dir": str(prom),
        "monitoring_defaults_dir": str(tmp_path / "etc" / "default"),
        "monitoring_promtool": str(TOOLS / "promtool"),
        "monitoring_amtool": str(TOOLS / "amtool"),
    }
    (tmp_path / "etc" / "default").mkdir(parents=True)
    play = tmp_path / "monitoring.yml"
    tasks = [{"name": "Monitoring", "ansible.builtin.include_role": {"name": "monitoring"}, "vars": settings}]
    play.write_text(yaml.safe_dump([{"hosts": "gateways", "gather_facts": False, "tasks": tasks}]))
    run = run_playbook(
        str(play), "-e", f"@{tmp_path / 'secrets.json'}", inventory=tmp_path / "inventory", timeout=120
    )
    out = " ".join(run.output.split())
    assert run.rc == 0, run.output[-4000:]
    assert (
        "rig-b is not reachable (stopped?): routing it to w8a8 (alias gemma) as the gateway last did" in out
    )
    config = yaml.safe_load((prom / "prometheus.yml").read_text())
    vllm = next(job for job in config["scrape_configs"] if job["job_name"] == "vllm")
    assert vllm["static_configs"] == [
        {"targets": ["127.0.0.1:8000"], "labels": {"rig": "rig-a"}},
        {"targets": ["127.0.0.1:8001"], "labels": {"rig": "rig-b"}},
    ]
