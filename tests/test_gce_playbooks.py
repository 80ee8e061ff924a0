"""provision_gce.yml and teardown_gce.yml run by ansible-playbook against the fake Compute API."""

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
from tests.conftest import ROOT
from tests.fake_compute import FakeComputeServer, Faults

# Each ansible-playbook run takes seconds (module start-up imports google-cloud-compute): the
# `lifecycle` fixture's runs serve several tests each.
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults(op_delay=0.05, stockout_zones={"us-central1-a"})) as server:
        yield server


def _inventory(tmp_path: Path) -> Path:
    key = tmp_path / "id_test.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaTEST rig@test\n")
    hosts = {
        "rigs": {
            "children": {
                "gce": {
                    "hosts": {"rig-test": None},
                    "vars": {
                        "gce_project": "proj",
                        "gce_zones": ["us-central1-a", "us-central1-b"],
                        "gce_ssh_public_key_file": str(key),
                        # The VM's interpreter: the module tasks must still run on the controller's.
                        "ansible_python_interpreter": "/usr/bin/python3",
                    },
                }
            }
        }
    }
    # The project's shared settings (rig_port...) come with every inventory, as with the real one.
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all").symlink_to(ROOT / "inventory" / "group_vars" / "all")
    path = tmp_path / "gce.yml"
    path.write_text(yaml.safe_dump(hosts))
    return path


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    return _inventory(tmp_path)


def _play(
    playbook: str, inventory: Path, fake: FakeComputeServer, *extra: str
) -> subprocess.CompletedProcess[str]:
    return play("gce", playbook, inventory, fake.endpoint, *extra)


def _where(tmp_path: Path) -> Path:
    return find_then_say(
        tmp_path,
        "{{ inventory_hostname }} at {{ ansible_host }} in {{ rig_gce_zone | default('(not looked up)') }},"
        " user {{ ansible_user }} ARGS {{ ansible_ssh_common_args | default('(none)') }}",
    )


@dataclass
class Lifecycle:
    """One rig's provisioning, a later command and two teardowns against one fake, in that order,
    with what the fake held after each: every ansible-playbook run here serves several tests."""

    provision: subprocess.CompletedProcess[str]
    inserts: list[dict]  # POST /instances requests
    firewalls: dict  # after provisioning
    firewall_posts: list[dict]
    instance: dict  # the VM as the fake holds it
    host_keys: dict[str, str]  # the VM's keys, as its guest attributes give them
    writes: int  # non-GET requests after provisioning
    known_hosts: Path
    later: subprocess.CompletedProcess[str]  # where.yml, with a second host that has its own address
    later_writes: int
    teardown: subprocess.CompletedProcess[str]
    instances_after_teardown: dict
    disks_after_teardown: list
    gone: subprocess.CompletedProcess[str]  # teardown_delete_data_disk=true
    disks_after_gone: dict


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    tmp_path = tmp_path_factory.mktemp("gce-lifecycle")
    inventory = _inventory(tmp_path)
    with FakeComputeServer(Faults(op_delay=0.05, stockout_zones={"us-central1-a"})) as fake:
        provision = _play("playbooks/provision_gce.yml", inventory, fake)
        inserts = fake.api.requests("POST", "/instances")
        inst = fake.api.instances[("us-central1-b", "rig-test")]
        writes = len([r for r in fake.api.log if r["method"] != "GET"])
        firewalls = copy.deepcopy(fake.api.firewalls)
        # A later command, with a second host the inventory gives its own address (next to the
        # first inventory: the same known_hosts).
        hosts = yaml.safe_load(inventory.read_text())
        hosts["rigs"]["children"]["gce"]["hosts"]["rig-pinned"] = {
            "ansible_host": "198.51.100.7",
            "ansible_user": "rig",
        }
        pinned = tmp_path / "gce-pinned.yml"
        pinned.write_text(yaml.safe_dump(hosts))
        (tmp_path / "later").mkdir()
        later = _play(str(_where(tmp_path / "later")), pinned, fake)
        later_writes = len([r for r in fake.api.log if r["method"] != "GET"])
        teardown = _play("playbooks/teardown_gce.yml", inventory, fake)
        instances_after_teardown, disks_after_teardown = dict(fake.api.instances), list(fake.api.disks)
        gone = _play("playbooks/teardown_gce.yml", inventory, fake, "-e", "teardown_delete_data_disk=true")
        yield Lifecycle(
            provision=provision,
            inserts=inserts,
            firewalls=firewalls,
            firewall_posts=fake.api.requests("POST", "/firewalls"),
            instance=inst,
            host_keys=fake.api.host_keys[inst["id"]],
            writes=writes,
            known_hosts=inventory.parent / "known_hosts",
            later=later,
            later_writes=later_writes,
            teardown=teardown,
            instances_after_teardown=instances_after_teardown,
            disks_after_teardown=disks_after_teardown,
            gone=gone,
            disks_after_gone=dict(fake.api.disks),
        )


def test_provision_reaches_the_ssh_wait_with_the_right_body(lifecycle: Lifecycle) -> None:
    result = lifecycle.provision
    out = result.stdout + result.stderr
    # The VM's IP is in TEST-NET-3 (unroutable): the play must get as far as waiting for SSH, and fail there.
    assert result.returncode == 2, out
    assert "TASK [gce : Wait for SSH on the VM]" in out
    # wait_for's own failure for the VM's address: a connect that never completes, or an answer
    # without OpenSSH; any other failure (or none) is not the SSH wait.
    assert re.search(r"Timeout when waiting for (search string OpenSSH in )?203\.0\.113\.\d+:22", out), out[
        -3000:
    ]
    inserts = lifecycle.inserts
    assert [r["path"].split("/")[6] for r in inserts] == ["us-central1-a", "us-central1-b"]
    body = inserts[-1]["body"]
    assert body["name"] == "rig-test"
    assert body["machineType"] == "zones/us-central1-b/machineTypes/n1-standard-2"
    assert body["guestAccelerators"][0]["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-t4")
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert [d["deviceName"] for d in body["disks"]] == ["rig-test", "rig-test-data"]
    assert body["disks"][1]["autoDelete"] is False
    assert {"key": "ssh-keys", "value": "rig:ssh-ed25519 AAAAC3NzaTEST rig@test"} in body["metadata"]["items"]
    # The shared tag, and the VM's own: the only one an endpoint rule of this VM may target.
    assert body["tags"]["items"] == ["gemma-rig", "rig-test"] and body["labels"] == {"app": "gemma-rig"}
    assert lifecycle.firewalls == {} and not lifecycle.firewall_posts  # closed by default
    assert "zone us-central1-a has no capacity" in out


def test_teardown_keeps_the_data_disk_and_says_what_costs(lifecycle: Lifecycle) -> None:
    result = lifecycle.teardown
    out = " ".join((result.stdout + result.stderr).split())  # the callback wraps long lines
    assert result.returncode == 0, out
    assert "removed: delete instance rig-test in us-central1-b" in out
    assert (
        "still costs money: data disk rig-test-data in us-central1-b, 250 GB pd-balanced, about $25.00/month"
        in out
    )
    assert lifecycle.instances_after_teardown == {}
    assert lifecycle.disks_after_teardown == [("us-central1-b", "rig-test-data")]

    gone = lifecycle.gone
    assert gone.returncode == 0, gone.stdout
    assert "delete data disk rig-test-data" in gone.stdout and lifecycle.disks_after_gone == {}
    assert "nothing of this rig still costs money" in gone.stdout


def test_a_rig_is_never_opened_to_outside_ranges(
    fake: FakeComputeServer, inventory: Path, tmp_path: Path
) -> None:
    """vLLM speaks plain HTTP: a rig's endpoint open to outside ranges would carry its key and the
    prompts in clear. Refused, with key and ranges both set, before any request; the VPC-only
    endpoint behind a gateway still needs both."""
    secret = "sk-test-0123456789abcdef"
    vars_file = tmp_path / "vault.yml"  # stands in for an ansible-vault file
    vars_file.write_text(
        yaml.safe_dump({"rig_api_key": secret, "gce_endpoint_source_ranges": ["198.51.100.0/24"]})
    )
    opened = _play(
        "playbooks/provision_gce.yml", inventory, fake, "-e", "gce_open_endpoint=true", "-e", f"@{vars_file}"
    )
    out = " ".join((opened.stdout + opened.stderr).split())
    assert opened.returncode == 2, out[-3000:]
    assert "would send its API key and prompts in plain HTTP" in out and "docs/gateway.md" in out
    assert "SSH or IAP tunnel" in out
    assert fake.api.log == [] and fake.api.firewalls == {}  # refused before any request
    assert secret not in out

    refused = _play("playbooks/provision_gce.yml", inventory, fake, "-e", "gce_internal_endpoint=true")
    assert refused.returncode == 2 and "needs rig_api_key" in " ".join(refused.stdout.split())
    assert fake.api.log == []


def test_check_mode_plays_change_nothing(fake: FakeComputeServer, inventory: Path) -> None:
    result = _play("playbooks/provision_gce.yml", inventory, fake, "--check", "--diff")
    assert result.returncode == 0, result.stdout
    assert fake.api.mutating_requests() == []
    assert "machine_type" in result.stdout  # the diff shows the planned VM


def _task_output(out: str, task: str) -> str:
    """The lines Ansible printed for one task (up to the next TASK or PLAY header)."""
    start = out.index(f"TASK [{task}]")
    following = [i for i in (out.find("\nTASK [", start + 1), out.find("\nPLAY ", start + 1)) if i > 0]
    return out[start : min(following, default=len(out))]


def test_site_yml_provisions_then_waits_for_ssh_and_a_second_run_changes_nothing(
    fake: FakeComputeServer, inventory: Path
) -> None:
    """The product entry point, not only the provisioning playbook, goes from nothing to the SSH
    wait. The fake fills in what the real API does (subnetwork, networkIP, fingerprints, scheduling
    defaults, disk URLs...); the second run must see no difference and send no changing request.

    Both runs stop at the SSH wait (the VM's address is unroutable), after provisioning.
    """
    first = _play("site.yml", inventory, fake)
    out = first.stdout + first.stderr
    assert first.returncode == 2, out
    assert "TASK [gce : Wait for SSH on the VM]" in out, out
    assert "TASK [rig_host" not in out  # nothing is configured on a VM that SSH never reached
    body = fake.api.requests("POST", "/instances")[-1]["body"]
    assert body["name"] == "rig-test"
    assert body["guestAccelerators"][0]["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-t4")
    assert "changed: [rig-test" in _task_output(out, "gce : Create or update the VM"), out
    vm = fake.api.instances[("us-central1-b", "rig-test")]
    assert vm["networkInterfaces"][0]["subnetwork"].endswith("/regions/us-central1/subnetworks/default")
    after_first = list(fake.api.mutating_requests())

    second = _play("site.yml", inventory, fake)
    out = second.stdout + second.stderr
    assert "TASK [gce : Wait for SSH on the VM]" in out, out
    task = _task_output(out, "gce : Create or update the VM")
    assert "ok: [rig-test" in task and "changed:" not in task and "FAILED" not in task, task
    assert fake.api.mutating_requests() == after_first  # reads only
    assert "did nothing" in _task_output(out, "gce : Report where the VM landed")


def test_a_later_command_finds_the_vm_and_changes_nothing(lifecycle: Lifecycle) -> None:
    """status.yml, swap.yml and the other ops playbooks in a later command than site.yml's: the
    inventory names the VM only, and find_vms.yml reads its address (read only) before they act."""
    provisioned = lifecycle.provision.stdout
    assert "TASK [gce : Wait for SSH on the VM]" in provisioned, provisioned[-3000:]
    later = lifecycle.later
    out = later.stdout + later.stderr
    assert later.returncode == 0, out[-3000:]
    assert re.search(r"rig-test at 203\.0\.113\.\d+ in us-central1-b, user rig", out), out[-3000:]
    assert lifecycle.later_writes == lifecycle.writes  # nothing created or changed
    assert lifecycle.inserts[-1]["body"]["name"] == "rig-test"


def test_a_later_command_without_the_vm_says_to_run_site(
    fake: FakeComputeServer, inventory: Path, tmp_path: Path
) -> None:
    later = _play(str(_where(tmp_path)), inventory, fake)
    out = later.stdout + later.stderr
    assert later.returncode == 2, out[-3000:]
    assert "VM rig-test is not in us-central1-a, us-central1-b in project proj: run site.yml" in out, out[
        -3000:
    ]
    assert "Say where" not in out
    assert not [r for r in fake.api.log if r["method"] != "GET"]


def test_a_host_with_its_own_address_is_left_as_it_is(lifecycle: Lifecycle) -> None:
    """A host the inventory already gives an address is not looked up, and the others still are."""
    out = lifecycle.later.stdout + lifecycle.later.stderr
    assert lifecycle.later.returncode == 0, out[-3000:]
    assert re.search(r"rig-test at 203\.0\.113\.\d+ in us-central1-b, user rig", out), out[-3000:]
    assert "rig-pinned at 198.51.100.7 in (not looked up)" in out, out[-3000:]


def test_the_vm_is_reached_only_with_its_pinned_host_keys(lifecycle: Lifecycle) -> None:
    """Provisioning pins the VM's keys (from the Compute API's guest attributes) next to the
    inventory, and the host, then and in a later command, gets ssh args that accept those only."""
    alias = f"gce/proj/us-central1-b/rig-test/{lifecycle.instance['id']}"
    assert_pinned(lifecycle.known_hosts, alias, lifecycle.host_keys, lifecycle.later)
