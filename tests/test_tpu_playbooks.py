"""The tpu playbooks against the fake Cloud TPU API (tests/fake_tpu), through the real client.

playbooks/provision_tpu.yml asks for the TPU VM and converges with changed=0; check mode sends no
write; teardown_tpu.yml removes it; and the ops playbooks in a later command (bench.yml, swap.yml,
status.yml ...) first run playbooks/find_vms.yml, which reads the VM's address read-only, or says
to run site.yml when there is none. No SSH server answers here: provisioning runs up to its SSH
wait (1 s), whose failure names the address it waited on. Each ansible-playbook run takes seconds:
the `lifecycle` fixture's runs serve several tests each.
"""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cloud_playbooks import assert_pinned, find_then_say, play
from tests.fake_tpu import FakeTpuServer, Faults

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture
def fake() -> Iterator[FakeTpuServer]:
    with FakeTpuServer(Faults(op_delay=0.02, provision_delay=0.1)) as server:
        yield server


def _inventory(tmp_path: Path) -> Path:
    key = tmp_path / "id_test.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaTEST rig@test\n")
    hosts = {
        "rigs": {
            "children": {
                "tpu": {
                    "hosts": {"tpu-test": None},
                    "vars": {
                        "tpu_project": "proj",
                        "tpu_zones": ["us-west4-a"],
                        "tpu_ssh_public_key_file": str(key),
                        "ansible_python_interpreter": "/usr/bin/python3",
                    },
                }
            }
        }
    }
    # The project's shared settings (the price table...) come with every inventory, as with the real one.
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    path = tmp_path / "tpu.yml"
    path.write_text(yaml.safe_dump(hosts))
    return path


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    return _inventory(tmp_path)


def _play(
    playbook: str, inventory: Path, fake: FakeTpuServer, *extra: str
) -> subprocess.CompletedProcess[str]:
    return play("tpu", playbook, inventory, fake.endpoint, *extra)


def _writes(fake: FakeTpuServer) -> list[dict]:
    # nodes.getGuestAttributes is a read the API takes as a POST (its body is the query).
    return [r for r in fake.api.log if r["method"] != "GET" and not r["path"].endswith(":getGuestAttributes")]


def _where(tmp_path: Path) -> Path:
    return find_then_say(
        tmp_path,
        "{{ inventory_hostname }} at {{ ansible_host }} in {{ rig_tpu_zone }}, user {{ ansible_user }}"
        " ARGS {{ ansible_ssh_common_args }}",
    )


def _provisioned(fake: FakeTpuServer, inventory: Path) -> str:
    """Provision (up to the SSH wait, which nothing answers here); the node's external address."""
    run = _play("playbooks/provision_tpu.yml", inventory, fake)
    out = run.stdout + run.stderr
    assert "TASK [tpu : Wait for SSH on the TPU VM]" in out, out[-3000:]
    found = re.search(r"external (34\.125\.\d+\.\d+)", out)
    assert found, out[-3000:]
    return found[1]


@dataclass
class Lifecycle:
    """One TPU VM provisioned, found by a later command, converged again, in check mode, torn down
    (dry, then for real) against one fake, in that order, with what the fake held after each:
    each ansible-playbook run here serves several tests."""

    address: str  # the node's external address, as provisioning said it
    queued_resources: list[dict]  # POST queuedResources requests
    writes: int  # after provisioning
    known_hosts: Path
    known_hosts_then: str  # its text when the later command ran
    node: dict  # the node as the fake held it
    host_keys: dict[str, str]  # the node's keys, as its guest attributes give them
    later: subprocess.CompletedProcess[str]  # where.yml: the address and the ssh args
    later_writes: int
    again: subprocess.CompletedProcess[str]
    check: subprocess.CompletedProcess[str]
    writes_after_check: int
    dry: subprocess.CompletedProcess[str]  # teardown --check
    down: subprocess.CompletedProcess[str]
    deletes: list[dict]  # DELETE queuedResources/tpu-test requests


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    tmp_path = tmp_path_factory.mktemp("tpu-lifecycle")
    inventory = _inventory(tmp_path)
    with FakeTpuServer(Faults(op_delay=0.02, provision_delay=0.1)) as fake:
        address = _provisioned(fake, inventory)
        writes = len(_writes(fake))
        (node,) = fake.api.nodes.values()
        node, host_keys = copy.deepcopy(node), dict(fake.api.host_keys[node["id"]])
        (tmp_path / "later").mkdir()
        later = _play(str(_where(tmp_path / "later")), inventory, fake)
        later_writes = len(_writes(fake))
        known_hosts = inventory.parent / "known_hosts"
        known_hosts_then = known_hosts.read_text() if known_hosts.exists() else ""
        again = _play("playbooks/provision_tpu.yml", inventory, fake)
        check = _play("playbooks/provision_tpu.yml", inventory, fake, "--check")
        writes_after_check = len(_writes(fake))
        dry = _play("playbooks/teardown_tpu.yml", inventory, fake, "--check")
        down = _play("playbooks/teardown_tpu.yml", inventory, fake)
        yield Lifecycle(
            address=address,
            queued_resources=fake.api.requests("POST", "queuedResources"),
            writes=writes,
            known_hosts=known_hosts,
            known_hosts_then=known_hosts_then,
            node=node,
            host_keys=host_keys,
            later=later,
            later_writes=later_writes,
            again=again,
            check=check,
            writes_after_check=writes_after_check,
            dry=dry,
            down=down,
            deletes=fake.api.requests("DELETE", "queuedResources/tpu-test"),
        )


def test_provision_converge_check_and_teardown(lifecycle: Lifecycle) -> None:
    address = lifecycle.address
    (qr,) = lifecycle.queued_resources
    assert qr["body"]["tpu"]["nodeSpec"][0]["node"]["acceleratorType"] == "v5litepod-1"
    assert "ssh-ed25519 AAAAC3NzaTEST" in qr["body"]["tpu"]["nodeSpec"][0]["node"]["metadata"]["ssh-keys"]

    again = lifecycle.again
    out = again.stdout + again.stderr
    assert "the same node as before" in out and address in out, out[-3000:]
    assert re.search(r"tpu-test\s+:.*changed=0", out), out[-3000:]
    check = lifecycle.check
    assert check.returncode == 0 and re.search(r"tpu-test\s+:.*changed=0", check.stdout), check.stdout[-3000:]
    # Neither the converge nor check mode (nor the later command between) wrote anything.
    assert lifecycle.writes_after_check == lifecycle.writes

    # The price said at provisioning and what a teardown says still bills are the cost report's.
    table = yaml.safe_load((ROOT / "inventory/group_vars/all/prices.yml").read_text())["rig_prices"]
    (chip,) = [e["usd"] for e in table["items"] if (e["what"], e["model"]) == ("tpu/v5litepod", "flex-start")]
    assert f"(flex-start, about ${chip:.2f}/h at the prices of {table['as_of']})" in out, out[-3000:]
    dry = lifecycle.dry
    assert f"still costs money: tpu-test running, about ${chip:.2f}/h" in dry.stdout, dry.stdout[-3000:]
    down = lifecycle.down
    assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
    assert lifecycle.deletes
    assert "nothing of this rig still costs money" in down.stdout, down.stdout[-3000:]


def test_a_later_command_finds_the_vm_and_changes_nothing(lifecycle: Lifecycle) -> None:
    """bench.yml, swap.yml, status.yml ... in a later command than site.yml's: the inventory names
    the TPU VM only, and find_vms.yml reads its address (read only) before they act."""
    later = lifecycle.later
    out = later.stdout + later.stderr
    assert later.returncode == 0, out[-3000:]
    assert f"tpu-test at {lifecycle.address} in us-west4-a, user rig" in out, out[-3000:]
    assert lifecycle.later_writes == lifecycle.writes


def test_a_later_command_without_the_vm_says_to_run_site(
    fake: FakeTpuServer, inventory: Path, tmp_path: Path
) -> None:
    later = _play(str(_where(tmp_path)), inventory, fake)
    out = later.stdout + later.stderr
    assert later.returncode == 2, out[-3000:]
    assert "TPU VM tpu-test is not in us-west4-a in project proj: run site.yml" in " ".join(out.split()), out[
        -3000:
    ]
    assert "Say where" not in out
    assert not _writes(fake)


def test_the_tpu_vm_is_reached_only_with_its_pinned_host_keys(lifecycle: Lifecycle) -> None:
    """Provisioning pins the node's keys (from the Cloud TPU API's guest attributes) next to the
    inventory, and a later command's host gets ssh args that accept those keys only."""
    alias = f"tpu/proj/us-west4-a/tpu-test/{lifecycle.node['id']}"
    # assert_pinned reads the file now: it must hold what it held when the later command ran.
    assert lifecycle.known_hosts.read_text() == lifecycle.known_hosts_then
    assert_pinned(lifecycle.known_hosts, alias, lifecycle.host_keys, lifecycle.later)
