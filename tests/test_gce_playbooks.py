"""provision_gce.yml and teardown_gce.yml run by ansible-playbook against the fake Compute API."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cloud_playbooks import assert_pinned, find_then_say, play
from tests.conftest import ROOT
from tests.fake_compute import FakeComputeServer, Faults

# Each test starts ansible-playbook (module start-up imports google-cloud-compute: seconds each).
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults(op_delay=0.05, stockout_zones={"us-central1-a"})) as server:
        yield server


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
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


def _play(
    playbook: str, inventory: Path, fake: FakeComputeServer, *extra: str
) -> subprocess.CompletedProcess[str]:
    return play("gce", playbook, inventory, fake.endpoint, *extra)


def test_provision_reaches_the_ssh_wait_with_the_right_body(fake: FakeComputeServer, inventory: Path) -> None:
    result = _play("playbooks/provision_gce.yml", inventory, fake)
    out = result.stdout + result.stderr
    # The VM's IP is in TEST-NET-3 (unroutable): the play must get as far as waiting for SSH, and fail there.
    assert result.returncode == 2, out
    assert "TASK [gce : Wait for SSH on the VM]" in out
    # wait_for's own failure for the VM's address: a connect that never completes, or an answer
    # without OpenSSH; any other failure (or none) is not the SSH wait.
    assert re.search(r"Timeout when waiting for (search string OpenSSH in )?203\.0\.113\.\d+:22", out), out[
        -3000:
    ]
    inserts = fake.api.requests("POST", "/instances")
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
    assert fake.api.firewalls == {} and not fake.api.requests("POST", "/firewalls")  # closed by default
    assert "zone us-central1-a has no capacity" in out


def test_teardown_keeps_the_data_disk_and_says_what_costs(fake: FakeComputeServer, inventory: Path) -> None:
    _play("playbooks/provision_gce.yml", inventory, fake)
    result = _play("playbooks/teardown_gce.yml", inventory, fake)
    out = " ".join((result.stdout + result.stderr).split())  # the callback wraps long lines
    assert result.returncode == 0, out
    assert "removed: delete instance rig-test in us-central1-b" in out
    assert (
        "still costs money: data disk rig-test-data in us-central1-b, 250 GB pd-balanced, about $25.00/month"
        in out
    )
    assert fake.api.instances == {} and list(fake.api.disks) == [("us-central1-b", "rig-test-data")]

    gone = _play("playbooks/teardown_gce.yml", inventory, fake, "-e", "teardown_delete_data_disk=true")
    assert gone.returncode == 0, gone.stdout
    assert "delete data disk rig-test-data" in gone.stdout and fake.api.disks == {}
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


def test_site_yml_for_gce_provisions_then_waits_for_ssh(fake: FakeComputeServer, inventory: Path) -> None:
    """The product entry point, not only the provisioning playbook, goes from nothing to the SSH wait."""
    result = _play("site.yml", inventory, fake)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "TASK [gce : Wait for SSH on the VM]" in out
    assert "TASK [rig_host" not in out  # nothing is configured on a VM that SSH never reached
    body = fake.api.requests("POST", "/instances")[-1]["body"]
    assert body["name"] == "rig-test"
    assert body["guestAccelerators"][0]["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-t4")


def _task_output(out: str, task: str) -> str:
    """The lines Ansible printed for one task (up to the next TASK or PLAY header)."""
    start = out.index(f"TASK [{task}]")
    following = [i for i in (out.find("\nTASK [", start + 1), out.find("\nPLAY ", start + 1)) if i > 0]
    return out[start : min(following, default=len(out))]


def test_second_site_yml_against_a_filled_in_api_changes_nothing(
    fake: FakeComputeServer, inventory: Path
) -> None:
    """The fake fills in what the real API does (subnetwork, networkIP, fingerprints, scheduling
    defaults, disk URLs...); the second run must see no difference and send no changing request.

    Both runs stop at the SSH wait (the VM's address is unroutable), after provisioning.
    """
    first = _play("site.yml", inventory, fake)
    out = first.stdout + first.stderr
    assert "TASK [gce : Wait for SSH on the VM]" in out, out
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


def _where(tmp_path: Path) -> Path:
    return find_then_say(
        tmp_path,
        "{{ inventory_hostname }} at {{ ansible_host }} in {{ rig_gce_zone | default('(not looked up)') }}, user {{ ansible_user }}",
    )


def test_a_later_command_finds_the_vm_and_changes_nothing(
    fake: FakeComputeServer, inventory: Path, tmp_path: Path
) -> None:
    """status.yml, swap.yml and the other ops playbooks in a later command than site.yml's: the
    inventory names the VM only, and find_vms.yml reads its address (read only) before they act."""
    first = _play("playbooks/provision_gce.yml", inventory, fake)
    assert "TASK [gce : Wait for SSH on the VM]" in first.stdout, first.stdout[-3000:]
    (vm,) = fake.api.requests("POST", "/instances")[-1:]
    writes = len([r for r in fake.api.log if r["method"] != "GET"])
    later = _play(str(_where(tmp_path)), inventory, fake)
    out = later.stdout + later.stderr
    assert later.returncode == 0, out[-3000:]
    assert re.search(r"rig-test at 203\.0\.113\.\d+ in us-central1-b, user rig", out), out[-3000:]
    assert len([r for r in fake.api.log if r["method"] != "GET"]) == writes  # nothing created or changed
    assert vm["body"]["name"] == "rig-test"


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


def test_a_host_with_its_own_address_is_left_as_it_is(
    fake: FakeComputeServer, inventory: Path, tmp_path: Path
) -> None:
    """A host the inventory already gives an address is not looked up, and the others still are."""
    first = _play("playbooks/provision_gce.yml", inventory, fake)
    assert "TASK [gce : Wait for SSH on the VM]" in first.stdout, first.stdout[-3000:]
    hosts = yaml.safe_load(inventory.read_text())
    hosts["rigs"]["children"]["gce"]["hosts"]["rig-pinned"] = {
        "ansible_host": "198.51.100.7",
        "ansible_user": "rig",
    }
    inventory.write_text(yaml.safe_dump(hosts))
    later = _play(str(_where(tmp_path)), inventory, fake)
    out = later.stdout + later.stderr
    assert later.returncode == 0, out[-3000:]
    assert re.search(r"rig-test at 203\.0\.113\.\d+ in us-central1-b, user rig", out), out[-3000:]
    assert "rig-pinned at 198.51.100.7 in (not looked up)" in out, out[-3000:]


def test_the_vm_is_reached_only_with_its_pinned_host_keys(
    fake: FakeComputeServer, inventory: Path, tmp_path: Path
) -> None:
    """Provisioning pins the VM's keys (from the Compute API's guest attributes) next to the
    inventory, and the host, then and in a later command, gets ssh args that accept those only."""
    first = _play("playbooks/provision_gce.yml", inventory, fake)
    assert "TASK [gce : Wait for SSH on the VM]" in first.stdout, first.stdout[-3000:]
    known_hosts = inventory.parent / "known_hosts"
    inst = fake.api.instances[("us-central1-b", "rig-test")]
    alias = f"gce/proj/us-central1-b/rig-test/{inst['id']}"
    (tmp_path / "later").mkdir()
    later = _play(
        str(find_then_say(tmp_path / "later", "ARGS {{ ansible_ssh_common_args }}")), inventory, fake
    )
    assert_pinned(known_hosts, alias, fake.api.host_keys[inst["id"]], later)
