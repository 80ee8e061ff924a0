"""roles/monitoring's configuration as Ansible renders it, checked by the packages' own tools.

The role runs on the controller rendering files only (monitoring_service_manage: false), for a
gateway host and for a monitoring host outside the gateways group, in front of two local rigs
(their tpu.env read by the gateway role's tasks/served.yml, as on a real gateway). The rigs are
in group `local` with the repository's inventory/group_vars/local.yml: its platform profile. The
role's own `validate:` runs promtool and amtool from build/prometheus (scripts/setup.sh); the
tests run them again on what was written.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.conftest import ROOT, VENV_BIN

TOOLS = ROOT / "build" / "prometheus" / "usr" / "bin"
PROMTOOL, AMTOOL = TOOLS / "promtool", TOOLS / "amtool"
KEY = "sk-rig-unit-0123456789abcdef"  # a test-only key
HOOK = "https://hooks.example.test/alerts?token=test-only-0123"
# A rig name with YAML and Jinja syntax in it: rendered as data (a quoted label value). Ansible's
# inventory itself refuses a name ending in ":" or holding a newline.
HOSTILE = "rig-b\"'}}{{ x }} #y"
PROFILE = yaml.safe_load((ROOT / "inventory" / "group_vars" / "local.yml").read_text())

pytestmark = pytest.mark.skipif(
    not (PROMTOOL.exists() and AMTOOL.exists()),
    reason="build/prometheus has no promtool/amtool (scripts/setup.sh unpacks them)",
)


def render(
    tmp: Path,
    monitor_vars: dict,
    group: str | None = "gateways",
    rig_b: str = "rig-b",
    rig_b_vars: dict | None = None,
    secrets: dict | None = None,
) -> tuple[int, str, Path]:
    """Run the monitoring role for one monitoring host ``mon`` in ``group``; return rc, output, its /etc.

    With no group, there is no monitoring host: playbooks/monitoring.yml runs, on the controller.
    """
    inventory = tmp / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    (inventory / "group_vars" / "local.yml").symlink_to(ROOT / "inventory" / "group_vars" / "local.yml")
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    env_a, env_b = tmp / "a.env", tmp / "b.env"
    env_a.write_text("RIG_SERVED_MODEL_NAME=emb4\n")
    env_b.write_text("RIG_SERVED_MODEL_NAME=w8a8\n")
    etc = tmp / "etc"
    hosts = {
        "rigs": {"children": {"local": {"hosts": {
            "rig-a": {**local, "rig_env_file": str(env_a)},
            rig_b: {**local, "rig_env_file": str(env_b), "rig_port": 8001, **(rig_b_vars or {})},
        }}}},
    }  # fmt: skip
    settings = {
        "monitoring_service_manage": False,
        "monitoring_config_dir": str(etc / "prometheus"),
        "monitoring_defaults_dir": str(etc / "default"),
        "monitoring_promtool": str(PROMTOOL),
        "monitoring_amtool": str(AMTOOL),
        **monitor_vars,
    }
    if group:
        hosts[group] = {"hosts": {"mon": {**local, **settings}}}
    else:  # the controller's play, without sudo here
        secrets = {**(secrets or {}), **settings, "ansible_become": False,
                   "ansible_python_interpreter": str(VENV_BIN / "python")}  # fmt: skip
    (etc / "default").mkdir(parents=True)
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    extra = tmp / "extra.json"
    extra.touch(mode=0o600)
    extra.write_text(json.dumps(secrets or {}))
    play = tmp / "play.yml"
    tasks = [{"name": "Monitoring", "ansible.builtin.include_role": {"name": "monitoring"}}]
    play.write_text(yaml.safe_dump([{"hosts": group, "gather_facts": False, "tasks": tasks}]))
    playbook = str(play) if group else str(ROOT / "playbooks" / "monitoring.yml")
    run = run_playbook(playbook, "-e", f"@{extra}", inventory=inventory, timeout=300)
    assert run.rc in (0, 2), run.output[-4000:]
    return run.rc, run.output, etc


def check(tool: Path, *args: str) -> None:
    """Run promtool or amtool; fail with its words."""
    done = subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def again(tmp: Path, *args: str) -> tuple[int, int, str]:
    """Run the play render() wrote once more (``args``: --check, ...); return its rc, changes, output."""
    run = run_playbook(
        str(tmp / "play.yml"), "-e", f"@{tmp / 'extra.json'}", *args, inventory=tmp / "inventory", timeout=300
    )
    return run.rc, run.total("changed"), run.output


def jobs(etc: Path) -> dict[str, dict]:
    """prometheus.yml's scrape jobs by name."""
    config = yaml.safe_load((etc / "prometheus" / "prometheus.yml").read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_a_gateway_scrapes_each_rig_at_its_gateway_address_with_the_key_in_a_file(tmp_path: Path) -> None:
    rc, output, etc = render(
        tmp_path,
        {"gateway_wake": True, "gateway_wake_port": 8442, "gateway_metrics_port": 8405},
        rig_b=HOSTILE,
        rig_b_vars={"gateway_backend_address": "10.128.0.9"},
        secrets={"rig_api_key": KEY, "monitoring_alert_webhook_url": HOOK},
    )
    assert rc == 0, output[-3000:]
    assert KEY not in output and "test-only-0123" not in output
    prom = etc / "prometheus"
    check(PROMTOOL, "check", "config", str(prom / "prometheus.yml"))
    check(AMTOOL, "check-config", str(prom / "alertmanager.yml"))
    config = yaml.safe_load((prom / "prometheus.yml").read_text())
    assert config["rule_files"] == [f"{prom}/rules/*.rules.yml"]
    assert sorted(p.name for p in (prom / "rules").iterdir()) == sorted(
        p.name for p in (ROOT / "roles/monitoring/files/rules").glob("*.rules.yml")
    )
    assert (prom / "consoles" / "gemma-rig.html").exists()
    assert config["global"]["scrape_interval"] == PROFILE["monitoring_profile_scrape_interval"]
    by_name = jobs(etc)
    assert sorted(by_name) == [
        "alertmanager",
        "gateway_usage",
        "haproxy",
        "node",
        "prometheus",
        "rig_waker",
        "vllm",
    ]
    vllm = by_name["vllm"]
    # Exactly the gateway's addresses: rig_listen_address:rig_port, and the rig's gateway_backend_address.
    assert vllm["static_configs"] == [
        {"targets": ["127.0.0.1:8000"], "labels": {"rig": "rig-a"}},
        {"targets": ["10.128.0.9:8001"], "labels": {"rig": HOSTILE}},  # the name as data
    ]
    assert vllm["authorization"] == {"type": "Bearer", "credentials_file": f"{prom}/rig-api-key"}
    key_file = prom / "rig-api-key"
    assert key_file.read_text() == KEY and key_file.stat().st_mode & 0o777 == 0o640
    assert KEY not in (prom / "prometheus.yml").read_text()
    assert by_name["haproxy"]["static_configs"] == [{"targets": ["127.0.0.1:8405"]}]
    assert by_name["gateway_usage"]["metrics_path"] == "/usage"
    assert by_name["rig_waker"]["static_configs"] == [{"targets": ["127.0.0.1:8442"]}]
    assert by_name["rig_waker"]["metrics_path"] == "/waker/metrics"
    am = yaml.safe_load((prom / "alertmanager.yml").read_text())
    assert am["receivers"] == [
        {"name": "gemma-rig", "webhook_configs": [{"url": HOOK, "send_resolved": True}]}
    ]
    assert am["route"]["group_wait"] == PROFILE["monitoring_profile_alert_group_wait"]
    assert (prom / "alertmanager.yml").stat().st_mode & 0o077 == 0o040
    args = (etc / "default" / "prometheus").read_text()
    assert "--web.listen-address=127.0.0.1:9090 " in args
    assert f"--storage.tsdb.retention.time={PROFILE['monitoring_profile_retention_time']} " in args
    assert f"--storage.tsdb.retention.size={PROFILE['monitoring_profile_retention_size']} " in args
    assert f"--web.console.templates={prom}/consoles " in args
    assert (
        "--web.listen-address=127.0.0.1:9093 --cluster.listen-address= "
        in (etc / "default" / "prometheus-alertmanager").read_text()
    )
    assert (
        'ARGS="--web.listen-address=127.0.0.1:9100 --collector.systemd"'
        in (etc / "default" / "prometheus-node-exporter").read_text()
    )


def test_a_host_outside_the_gateways_without_a_key_scrapes_the_rigs_plainly(tmp_path: Path) -> None:
    (tmp_path / "etc" / "prometheus").mkdir(parents=True)
    (tmp_path / "etc" / "prometheus" / "rig-api-key").write_text("an old key")
    rc, output, etc = render(tmp_path, {"monitoring_profile_retention_time": "3d"}, group="monitors")
    assert rc == 0, output[-3000:]
    check(PROMTOOL, "check", "config", str(etc / "prometheus" / "prometheus.yml"))
    check(AMTOOL, "check-config", str(etc / "prometheus" / "alertmanager.yml"))
    by_name = jobs(etc)
    assert sorted(by_name) == ["alertmanager", "node", "prometheus", "vllm"]  # no HAProxy, no rig-waker here
    assert "authorization" not in by_name["vllm"]
    assert not (etc / "prometheus" / "rig-api-key").exists()  # an old key is removed
    assert [c["targets"] for c in by_name["vllm"]["static_configs"]] == [
        ["127.0.0.1:8000"],
        ["127.0.0.1:8001"],
    ]
    am = yaml.safe_load((etc / "prometheus" / "alertmanager.yml").read_text())
    assert am["receivers"] == [{"name": "gemma-rig"}]  # no webhook: alerts stay in Alertmanager
    # The host's own profile value beats its fleet's.
    assert "--storage.tsdb.retention.time=3d " in (etc / "default" / "prometheus").read_text()


# (An inventory value holding "{{" is a template to Ansible itself, which fails before the role.)
@pytest.mark.parametrize(
    "address", ["10.0.0.1\n  - job_name: x", "h' \"x", "10.0.0.1:80/metrics?x", "fe80::1"]
)
def test_a_hostile_rig_address_is_refused_in_one_line(tmp_path: Path, address: str) -> None:
    rc, output, etc = render(tmp_path, {}, rig_b_vars={"gateway_backend_address": address})
    assert rc == 2
    assert 'each rig\'s address a host name or IPv4 address (refused: ["rig-b"])' in " ".join(output.split())
    assert not (etc / "prometheus" / "prometheus.yml").exists()


def test_a_render_promtool_refuses_leaves_the_old_configuration(tmp_path: Path) -> None:
    old = "# the configuration in use\nglobal: {}\n"
    (tmp_path / "etc" / "prometheus").mkdir(parents=True)
    (tmp_path / "etc" / "prometheus" / "prometheus.yml").write_text(old)
    rc, output, etc = render(tmp_path, {"monitoring_scrape_interval": "5 parsecs"})
    assert rc == 2 and "promtool" in output
    assert (etc / "prometheus" / "prometheus.yml").read_text() == old


def test_with_no_gateway_the_playbook_sets_monitoring_up_on_the_controller(tmp_path: Path) -> None:
    rc, output, etc = render(tmp_path, {}, group=None)
    assert rc == 0, output[-3000:]
    assert "PLAY [Monitoring on the controller (a fleet with no gateway)]" in output
    check(PROMTOOL, "check", "config", str(etc / "prometheus" / "prometheus.yml"))
    by_name = jobs(etc)
    assert sorted(by_name) == ["alertmanager", "node", "prometheus", "vllm"]
    assert [c["labels"]["rig"] for c in by_name["vllm"]["static_configs"]] == ["rig-a", "rig-b"]
    # The controller is in no platform group: its fleet's profile (the rigs' local.yml).
    config = yaml.safe_load((etc / "prometheus" / "prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == PROFILE["monitoring_profile_scrape_interval"]


def test_a_second_run_changes_nothing_and_check_mode_diff_shows_no_key(tmp_path: Path) -> None:
    rc, output, _ = render(tmp_path, {"gateway_wake": True}, secrets={"rig_api_key": KEY})
    assert rc == 0, output[-3000:]
    assert again(tmp_path)[:2] == (0, 0)
    # The key file changes under --diff: Ansible shows nothing of it.
    (tmp_path / "etc" / "prometheus" / "rig-api-key").write_text("an old key")
    rc, changed, output = again(tmp_path, "--check", "--diff")
    assert (rc, changed) == (0, 1) and KEY not in output and "an old key" not in output
