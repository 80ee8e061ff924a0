"""Wake on request as roles/gateway renders it: haproxy.cfg's backup server and rig-waker's configuration.

The role's `tls` and `config` tasks run on the controller, rendering files only
(gateway_service_manage: false), as tests/unit/test_gateway_gce_backends.py runs them: one
Compute Engine rig (its project, and the zone roles/gce records) and one local rig. The template
task runs `haproxy -c` on haproxy.cfg before it is written.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import PlaybookRun, render_gateway, run_playbook
from tests.conftest import ROOT, VENV_BIN

KEY = "sk-gw-unit-0123456789abcdef"  # a test-only key
TOKEN = "ya29.test-only-token-0123"


LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}


def render_gateways(tmp: Path, gateways: dict[str, dict], gce_rig: dict) -> PlaybookRun:
    """Render each gateway in ``gateways`` (name -> its vars), each under tmp/NAME (tmp itself for
    ``gw``), in front of the same two rigs, in one run: ansible renders or fails each on its own."""
    inventory = tmp / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    env_a, env_b = tmp / "a.env", tmp / "b.env"
    env_a.write_text("RIG_MODEL_KEY=emb4\nRIG_SERVED_MODEL_NAME=emb4\nRIG_SERVED_ALIAS=gemma\n")
    env_b.write_text("RIG_MODEL_KEY=w8a8\nRIG_SERVED_MODEL_NAME=w8a8\nRIG_SERVED_ALIAS=gemma\n")
    gce = {"gce_internal_ip": "10.128.0.7", "rig_endpoint_open": True, "gce_project": "proj-1", **gce_rig}
    hosts = {
        "rigs": {
            "hosts": {"rig-local": {**LOCAL, "rig_env_file": str(env_b), "rig_port": 8001}},
            "children": {"gce": {"hosts": {"rig-1": {**LOCAL, "rig_env_file": str(env_a), **gce}}}},
        },
        "gateways": {
            "hosts": {
                name: {
                    **LOCAL,
                    "gateway_service_manage": False,
                    "gateway_config_dir": str(where(tmp, name) / "etc"),
                    "gateway_admin_socket": str(where(tmp, name) / "admin.sock"),
                    "gateway_controller_dir": str(where(tmp, name) / "ctl"),
                    "gateway_address": "127.0.0.1",
                    "gateway_extra_models": ["w4a16"],
                    **gateway_vars,
                }
                for name, gateway_vars in gateways.items()
            }
        },
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    run = render_gateway(tmp, inventory, {"gateway_api_keys": {"alice": KEY}, "gateway_wake_token": TOKEN})
    assert run.rc in (0, 2), run.output[-4000:]
    return run


def where(tmp: Path, name: str) -> Path:
    """The directory gateway ``name`` renders under."""
    return tmp if name == "gw" else tmp / name


def render(tmp: Path, gateway_vars: dict, gce_rig: dict) -> tuple[int, str, Path]:
    """Render one gateway ``gw``; return rc, output and its /etc."""
    run = render_gateways(tmp, {"gw": gateway_vars}, gce_rig)
    return run.rc, run.output, tmp / "etc"


# Three gateways in front of the same rigs (rig-1 in a zone, spot), rendered in one run: wake on
# (its own port), wake off, and wake on for the test that then turns it off.
WAKE_ON, WAKE_OFF, TURNED_OFF = "gw-on", "gw-off", "gw-turned-off"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PlaybookRun]:
    tmp = tmp_path_factory.mktemp("wake")
    gateways = {WAKE_ON: {"gateway_wake": True, "gateway_wake_port": 8442}, WAKE_OFF: {},
                TURNED_OFF: {"gateway_wake": True}}  # fmt: skip
    return tmp, render_gateways(
        tmp, gateways, {"rig_gce_zone": "us-east1-c", "gce_provisioning_model": "spot"}
    )


def test_wake_on_gives_every_backend_the_waker_as_backup(rendered: tuple[Path, PlaybookRun]) -> None:
    tmp, run = rendered
    etc = where(tmp, WAKE_ON) / "etc"
    assert run.rc == 0 and TOKEN not in run.output, run.output[-4000:]
    cfg = (etc / "haproxy.cfg").read_text()
    backends = list(cfg.split("\nbackend ")[1:])
    assert [b.split("\n", 1)[0] for b in backends] == [
        "be_default", "model_emb4", "model_w4a16", "model_w8a8", "alias_gemma"
    ]  # fmt: skip
    for backend in backends:
        assert "    http-request set-header X-Gemma-Rig-Backend %[be_name]\n" in backend
        assert "    server rig-waker 127.0.0.1:8442 backup\n" in backend
    check = subprocess.run(["haproxy", "-c", "-f", str(etc / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    waker = json.loads((etc / "gemma-gateway" / "rig-waker.json").read_text())
    assert (
        waker["port"] == 8442 and waker["timeout"] == 540 and waker["api"] == "https://compute.googleapis.com"
    )
    assert waker["watch"] == 30  # spot recovery's look at the spot rigs
    assert waker["token"] == {"file": "/run/credentials/gemma-rig-waker.service/token"}
    assert waker["rigs"] == [  # in the inventory's order (groups['rigs'])
        {"name": "rig-local", "address": "127.0.0.1", "port": 8001, "project": "local", "zone": "local-a",
         "instance": "rig-local", "spot": False},
        {"name": "rig-1", "address": "10.128.0.7", "port": 8000, "project": "proj-1", "zone": "us-east1-c",
         "instance": "rig-1", "spot": True},  # gce_provisioning_model: spot
    ]  # fmt: skip
    assert waker["backends"] == {
        "be_default": ["rig-local", "rig-1"],
        "model_emb4": ["rig-1"],
        "model_w4a16": [],  # no rig serves it: the waker answers so at once
        "model_w8a8": ["rig-local"],
        "alias_gemma": ["rig-local", "rig-1"],
    }
    token = etc / "gemma-gateway" / "rig-waker.token"
    assert token.read_text() == TOKEN + "\n" and token.stat().st_mode & 0o077 == 0
    assert (etc / "gemma-gateway" / "rig-waker.json").stat().st_mode & 0o077 == 0


def test_wake_off_renders_no_waker(rendered: tuple[Path, PlaybookRun]) -> None:
    tmp, run = rendered
    etc = where(tmp, WAKE_OFF) / "etc"
    assert run.rc == 0, run.output[-4000:]
    assert "rig-waker" not in (etc / "haproxy.cfg").read_text()
    assert not (etc / "gemma-gateway" / "rig-waker.json").exists()


def test_a_gce_rig_without_a_zone_is_refused(tmp_path: Path) -> None:
    rc, failed, etc = render(tmp_path, {"gateway_wake": True}, {})
    assert rc == 2
    assert "Wake on request needs each rig's project and zone: rig-1 has none" in " ".join(failed.split())
    assert not (etc / "gemma-gateway" / "rig-waker.json").exists()


def wake_tasks(tmp: Path, host: str, *extra: str) -> tuple[int, int]:
    """roles/gateway's wake tasks alone with gateway_wake off, on ``host`` of the inventory
    render_gateways() wrote: (rc, changed tasks)."""
    play = tmp / "off.yml"
    include = {"ansible.builtin.include_role": {"name": "gateway", "tasks_from": "wake"}}
    play.write_text(yaml.safe_dump([{"hosts": "gateways", "gather_facts": False, "tasks": [include]}]))
    run = run_playbook(
        str(play),
        "-e",
        "gateway_wake=false",
        "--limit",
        host,
        *extra,
        inventory=tmp / "inventory",
        timeout=300,
    )
    assert run.rc == 0, run.output[-4000:]
    return run.rc, run.total("changed", [host])


def test_wake_turned_off_removes_the_waker_the_last_run_set_up(rendered: tuple[Path, PlaybookRun]) -> None:
    tmp, run = rendered
    etc = where(tmp, TURNED_OFF) / "etc"
    files = [etc / "gemma-gateway" / "rig-waker.json", etc / "gemma-gateway" / "rig-waker.token"]
    assert run.rc == 0 and all(f.exists() for f in files), run.output[-4000:]
    assert wake_tasks(tmp, TURNED_OFF, "--check")[1] == 1 and all(
        f.exists() for f in files
    )  # check mode: said, not done
    assert wake_tasks(tmp, TURNED_OFF)[1] == 1
    assert not any(f.exists() for f in files)
    assert wake_tasks(tmp, TURNED_OFF)[1] == 0  # gone already: nothing to do


def test_wake_turned_off_stops_disables_and_removes_the_unit() -> None:
    """What the off branch does to the service (no systemd on the controller to run it against):
    stop and disable the unit if its file is there, remove the program and the unit, reload."""
    tasks = yaml.safe_load((ROOT / "roles/gateway/tasks/wake.yml").read_text())
    off = next(t for t in tasks if t["when"] == "not gateway_wake | bool")["block"]
    stop = next(t for t in off if t.get("ansible.builtin.systemd_service", {}).get("state"))
    assert stop["ansible.builtin.systemd_service"] == {
        "name": "{{ _gateway_wake_unit }}", "state": "stopped", "enabled": False
    }  # fmt: skip
    assert "_gateway_wake_unit_left.stat.exists" in stop["when"]
    remove = next(t for t in off if "ansible.builtin.file" in t)
    assert remove["ansible.builtin.file"]["state"] == "absent"
    assert set(remove["vars"]["_gateway_wake_installed"]) == {
        "{{ _gateway_wake_bin }}", "/etc/systemd/system/{{ _gateway_wake_unit }}.service"
    }  # fmt: skip
    reload = off[-1]["ansible.builtin.systemd_service"]
    assert reload == {"daemon_reload": True} and "_gateway_wake_removed is changed" in off[-1]["when"]
    on = next(t for t in tasks if t["when"] == "gateway_wake | bool")["block"]
    assert any(t.get("ansible.builtin.copy", {}).get("dest") == "{{ _gateway_wake_config }}" for t in on)


def test_config_runs_the_wake_tasks_either_way() -> None:
    """wake.yml's take-down branch is reached only if config.yml includes it with wake off too."""
    tasks = yaml.safe_load((ROOT / "roles/gateway/tasks/config.yml").read_text())
    include = next(t for t in tasks if t.get("ansible.builtin.include_tasks") == "wake.yml")
    assert "when" not in include
