"""What a rig sends back (tpu.env's keys, the id vLLM lists) is data the controller checks first.

Real ansible-playbook runs the real playbooks and task files against rigs that are this machine
(``ansible_connection: local``), each with its own tpu.env in tmp_path and a FakeRig
(tests/fake_rig.py) answering as its vLLM. One host per hostile value, so one run covers them all.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT, VENV_BIN
from tests.fake_rig import FakeRig


def hostile_keys(marker: Path) -> dict[str, str]:
    return {
        "shell": f"x; touch {marker}",
        "traversal": "../../etc",
        "template": "{{ lookup('pipe', 'touch " + str(marker) + "') }}",
        "json": 'x", "disk_free_bytes": 1e30, "y": "',
    }


EVIL_ID = "../../../tmp/evil"


def write_inventory(tmp_path: Path, hosts: dict[str, dict], gateways: dict[str, dict] | None = None) -> Path:
    """Rigs reached on this machine, with the project's real group_vars."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "group_vars").symlink_to(ROOT / "inventory" / "group_vars")
    base = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    tree = {
        "rigs": {"hosts": {n: {**base, "rig_listen_address": "127.0.0.1", **v} for n, v in hosts.items()}}
    }
    if gateways:
        tree["gateways"] = {"hosts": {n: {**base, **v} for n, v in gateways.items()}}
    (inv / "hosts.yml").write_text(json.dumps(tree))
    return inv / "hosts.yml"


def rigs_with(tmp_path: Path, stack: ExitStack, keys: dict[str, str | None], served: dict[str, str]) -> dict:
    """One host per entry: its tpu.env (RIG_MODEL_KEY=keys[name], none when None) and its vLLM."""
    hosts = {}
    for name, key in keys.items():
        env = tmp_path / f"{name}.env"
        env.write_text(
            ("" if key is None else f"RIG_MODEL_KEY={key}\n") + "RIG_MAX_NUM_SEQS=4\nRIG_MAX_MODEL_LEN=64\n"
        )
        rig = stack.enter_context(FakeRig(served[name]))
        hosts[name] = {"rig_port": rig.port, "rig_env_file": str(env)}
    return hosts


def failed_line(run: PlaybookRun, host: str) -> str:
    """The one-line error of ``host``'s failed check (each message starts with the host's name)."""
    head = "[ERROR]: Task failed: Action failed: "
    lines = [line for line in run.output.splitlines() if line.startswith(f"{head}{host}")]
    assert len(lines) == 1, run.output[-3000:]
    return lines[0][len(head) :]


def nothing_written_outside(tmp_path: Path, marker: Path) -> None:
    assert not marker.exists()
    assert not Path("/tmp/evil").exists() and not (ROOT / "etc").exists()


def test_bench_refuses_names_a_rig_reports_that_are_not_plain(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    keys: dict[str, str | None] = {**hostile_keys(marker), "evil_id": None}
    served = {**{n: k for n, k in keys.items() if k is not None}, "evil_id": EVIL_ID}
    work = tmp_path / "work"
    work.mkdir()
    with ExitStack() as stack:
        inventory = write_inventory(tmp_path, rigs_with(tmp_path, stack, keys, served))
        run = run_playbook(
            "playbooks/bench.yml", "--forks", "8", inventory=inventory,
            extra_vars={
                "bench_log_file": str(tmp_path / "vllm.log"), "bench_tmp_root": str(work),
                "bench_fetch_root": str(tmp_path / "fetch"), "bench_runs_dir": str(tmp_path / "runs"),
                "bench_update_index": False,
            },
        )  # fmt: skip
    assert run.rc != 0
    for name, key in keys.items():
        line = failed_line(run, name)
        assert "reported a name that is not a plain name" in line, line
        assert json.dumps(key if key is not None else "")[:20] in line or json.dumps(EVIL_ID) in line, line
    assert "TASK [bench : Make a working directory on the rig]" not in run.output
    assert (
        list(work.iterdir()) == [] and not (tmp_path / "fetch").exists() and not (tmp_path / "runs").exists()
    )
    nothing_written_outside(tmp_path, marker)


def test_accuracy_refuses_a_served_id_that_is_a_path(tmp_path: Path) -> None:
    with FakeRig(EVIL_ID) as rig:
        inventory = write_inventory(tmp_path, {"r": {"rig_port": rig.port}})
        run = run_playbook(
            "playbooks/accuracy.yml", inventory=inventory,
            extra_vars={"accuracy_fetch_root": str(tmp_path / "a" / "b" / "c" / "accuracy"), "accuracy_env_file": ""},
        )  # fmt: skip
    assert run.rc != 0
    line = failed_line(run, "r")
    assert "r serves a model id that is not a plain name" in line and json.dumps(EVIL_ID) in line, line
    assert "Make a working directory on the rig" not in run.output
    assert not (tmp_path / "a").exists()
    nothing_written_outside(tmp_path, tmp_path / "MARKER")


def env_files(tmp_path: Path, keys: dict[str, str]) -> dict[str, str]:
    """One tpu.env per host, holding that host's RIG_MODEL_KEY: the host name -> the file's path."""
    files = {}
    for name, key in keys.items():
        env = tmp_path / f"{name}.env"
        env.write_text(f"RIG_MODEL_KEY={key}\n")
        files[name] = str(env)
    return files


def each_key_refused(run: PlaybookRun, keys: dict[str, str]) -> None:
    """Every host with a hostile key failed with the one line naming it as no catalog key."""
    for name, key in keys.items():
        line = failed_line(run, name)
        assert f"{name}: tpu.env's RIG_MODEL_KEY {json.dumps(key)[:20]}" in line, line
        assert "is not a catalog key" in line, line


def test_swap_reads_only_a_catalog_key_back(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    keys = hostile_keys(marker)
    play = tmp_path / "read_state.yml"
    play.write_text(
        json.dumps(
            [{"hosts": "rigs", "gather_facts": False, "tasks": [
                {"name": "Read the swap's state",
                 "ansible.builtin.include_role": {"name": "swap", "tasks_from": "read_state"}},
                {"name": "Say what was read", "ansible.builtin.debug": {"var": "_swap_old_model"}},
            ]}]
        )
    )  # fmt: skip
    hosts = {
        name: {"rig_env_file": env, "rig_current_model_link": str(tmp_path / "current")}
        for name, env in env_files(tmp_path, {**keys, "good": "tiny-emb4"}).items()
    }
    (tmp_path / "current").symlink_to(tmp_path)
    run = run_playbook(str(play), "--forks", "8", inventory=write_inventory(tmp_path, hosts))
    assert run.recap["good"]["failed"] == 0, run.output[-3000:]
    each_key_refused(run, keys)
    nothing_written_outside(tmp_path, marker)


def test_capacity_reports_the_served_key_as_data_or_refuses_it(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    keys = hostile_keys(marker)
    hosts = {
        name: {"rig_env_file": env, "rig_models_dir": str(tmp_path / "models")}
        for name, env in env_files(tmp_path, {**keys, "good": "tiny-emb4"}).items()
    }
    hosts["fresh"] = {"rig_env_file": str(tmp_path / "none.env"), "rig_models_dir": str(tmp_path / "models")}
    run = run_playbook("playbooks/capacity.yml", "--forks", "8", inventory=write_inventory(tmp_path, hosts))
    for name in ("good", "fresh"):
        assert run.recap[name]["failed"] == 0, run.output[-3000:]
    shown = run.output.split("TASK [Show the capacity]", 1)[1]
    assert "served_key: tiny-emb4" in shown and "served_key: ''" in shown, shown
    assert "1e30" not in shown and "1.0e+30" not in shown
    each_key_refused(run, keys)
    nothing_written_outside(tmp_path, marker)


def test_a_failed_bench_leaves_no_gateway_key_on_the_rig(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    gateway_dir = tmp_path / "gateway"
    gateway_dir.mkdir()
    (gateway_dir / "gw.crt").write_text("not a certificate\n")
    secret = "sk-outside-strings-secret"
    with ExitStack() as stack:
        hosts = rigs_with(tmp_path, stack, {"r": "tiny-emb4"}, {"r": "tiny-emb4"})
        # Nothing listens on port 9 of loopback: every request of the sweep fails.
        gateways = {"gw": {"gateway_url": "https://127.0.0.1:9"}}
        run = run_playbook(
            "playbooks/bench.yml", "--limit", "rigs", inventory=write_inventory(tmp_path, hosts, gateways),
            extra_vars={
                "bench_log_file": str(tmp_path / "vllm.log"), "bench_tmp_root": str(work),
                "bench_fetch_root": str(tmp_path / "fetch"), "bench_runs_dir": str(tmp_path / "runs"),
                "bench_update_index": False, "via_gateway": True, "gateway_controller_dir": str(gateway_dir),
                "gateway_api_keys": {"bench": secret}, "bench_input_lens": [8], "bench_concurrency": [1],
                "bench_repeats": 1, "bench_decode_runs": 0, "bench_request_timeout_s": 5,
                "bench_model_dir": str(tmp_path / "no-model"),
            },
        )  # fmt: skip
    assert run.rc != 0
    assert (
        "fatal: [r]" in run.output or "failed: [r]" in run.output
    ) and "Run the sweep, one cell at a time" in run.output, run.output[-3000:]
    # The key reached the rig (the sweep ran), and the working directory went with it.
    assert "Give the client the gateway's key" in run.output
    assert "TASK [bench : Remove the working directory on the rig]" in run.output
    assert list(work.iterdir()) == [], list(work.rglob("*"))
    assert secret not in run.output


def test_a_failed_accuracy_run_leaves_no_gateway_key_on_the_rig(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    gateway_dir = tmp_path / "gateway"
    gateway_dir.mkdir()
    (gateway_dir / "gw.crt").write_text("not a certificate\n")
    secret = "sk-outside-strings-secret"
    with FakeRig("tiny-emb4") as rig:
        inventory = write_inventory(
            tmp_path, {"r": {"rig_port": rig.port}}, {"gw": {"gateway_url": "https://127.0.0.1:9"}}
        )
        run = run_playbook(
            "playbooks/accuracy.yml", "--limit", "rigs", inventory=inventory,
            extra_vars={
                "accuracy_tmp_root": str(work), "accuracy_fetch_root": str(tmp_path / "scores"),
                "via_gateway": True, "gateway_controller_dir": str(gateway_dir),
                "gateway_api_keys": {"bench": secret}, "accuracy_env_file": "",
            },
        )  # fmt: skip
    assert run.rc != 0
    assert "Score every record on this rig's endpoint" in run.output and "fatal: [r]" in run.output
    assert "Give the scorer the gateway's key" in run.output
    assert "TASK [accuracy : Remove the working directory on the rig]" in run.output
    assert list(work.iterdir()) == [], list(work.rglob("*"))
    assert secret not in run.output


def test_the_gateway_routes_only_plain_names_a_rig_reports(tmp_path: Path) -> None:
    """tpu.env's served name and alias become gateway-ctl's arguments (and HAProxy backend names):
    each hostile one is refused on its own host before gateway-ctl runs; a plain pair reaches it
    as separate argv words."""
    marker = tmp_path / "MARKER"
    hostile = {**hostile_keys(marker), "option": "--socket=/tmp/evil"}
    called = tmp_path / "gateway-ctl.argv"
    ctl = tmp_path / "gateway-ctl"
    ctl.write_text(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" >> "
        + str(called)
        + '\necho "$5: in service for $6, nothing to restore"\n'
    )
    ctl.chmod(0o755)
    envs = {f"name-{k}": f"RIG_SERVED_MODEL_NAME={v}\nRIG_SERVED_ALIAS=\n" for k, v in hostile.items()}
    envs |= {
        f"alias-{k}": f"RIG_SERVED_MODEL_NAME=tiny-emb4\nRIG_SERVED_ALIAS={v}\n" for k, v in hostile.items()
    }
    envs["good"] = "RIG_SERVED_MODEL_NAME=tiny-emb4\nRIG_SERVED_ALIAS=tiny-gemma-4\n"
    ctl_vars = {"gateway_ctl": str(ctl), "gateway_admin_socket": str(tmp_path / "admin.sock")}
    hosts = {}
    for name, text in envs.items():
        (tmp_path / f"{name}.env").write_text(text)
        # gateway-ctl is run on the gateway with the rig's variables (delegate_to), as swap.yml does
        hosts[name] = {"rig_env_file": str(tmp_path / f"{name}.env"), **ctl_vars}
    play = tmp_path / "ready.yml"
    play.write_text(
        json.dumps(
            [{"hosts": "rigs", "gather_facts": False, "tasks": [
                {"name": "Put the rig back", "vars": {"gateway_hosts": ["gw"]},
                 "ansible.builtin.include_role": {"name": "gateway", "tasks_from": "ready"}},
            ]}]
        )
    )  # fmt: skip
    run = run_playbook(str(play), "--forks", "8", inventory=write_inventory(tmp_path, hosts, {"gw": {}}))
    assert run.recap["good"]["failed"] == 0, run.output[-3000:]
    for name in envs.keys() - {"good"}:
        line = failed_line(run, name)
        assert "RIG_SERVED_MODEL_NAME/RIG_SERVED_ALIAS in" in line and "must be plain names" in line, line
    argv = called.read_text().splitlines()
    assert argv == ["--socket", str(tmp_path / "admin.sock"), "restore", "good", "tiny-emb4",
                    "--alias", "tiny-gemma-4", "--timeout", "60"]  # fmt: skip
    nothing_written_outside(tmp_path, marker)


def test_the_gateway_renders_nothing_from_names_that_are_not_plain(tmp_path: Path) -> None:
    """The gateway role reads every rig's tpu.env for the names it routes by; hostile ones (as the
    served name or as the alias) stop it before a backend name, a map key or haproxy.cfg is written."""
    marker = tmp_path / "MARKER"
    hostile = {**hostile_keys(marker), "option": "--socket=/tmp/evil", "spaced": "x track be_default/y"}
    envs = {f"name-{k}": f"RIG_SERVED_MODEL_NAME={v}\nRIG_SERVED_ALIAS=\n" for k, v in hostile.items()}
    envs |= {
        f"alias-{k}": f"RIG_SERVED_MODEL_NAME=tiny-emb4\nRIG_SERVED_ALIAS={v}\n" for k, v in hostile.items()
    }
    hosts = {}
    for name, text in envs.items():
        (tmp_path / f"{name}.env").write_text(text)
        hosts[name] = {"rig_env_file": str(tmp_path / f"{name}.env"), "rig_port": 8000}
    etc = tmp_path / "etc"
    gateway = {"gateway_service_manage": False, "gateway_config_dir": str(etc), "gateway_port": 18443}
    play = tmp_path / "config.yml"
    play.write_text(
        json.dumps(
            [{"hosts": "gateways", "gather_facts": False, "tasks": [
                {"name": "Render", "ansible.builtin.include_role": {"name": "gateway", "tasks_from": "config"}},
            ]}]
        )
    )  # fmt: skip
    run = run_playbook(str(play), inventory=write_inventory(tmp_path, hosts, {"gw": gateway}))
    assert run.rc != 0 and run.recap["gw"]["failed"] == 1, run.output[-3000:]
    said = " ".join(run.output.split())
    assert "RIG_SERVED_MODEL_NAME and RIG_SERVED_ALIAS in its tpu.env must be plain names" in said, (
        run.output[-3000:]
    )
    assert not etc.exists() or not any(p.is_file() for p in etc.rglob("*"))
    nothing_written_outside(tmp_path, marker)
