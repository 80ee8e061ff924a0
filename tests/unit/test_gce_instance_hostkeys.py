"""gce_instance pins a new VM's SSH host keys from its guest attributes, and runs it as no one.

Against the fake Compute API (tests/fake_compute), through google-cloud-compute: the fake serves
instances.getGuestAttributes as the API does (404 until the guest has published hostkeys/, and
only when the metadata enable-guest-attributes is TRUE), in the client's GuestAttributes shape.
"""

from __future__ import annotations

import os
import stat
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_compute.harness import run_module
from tests.fake_compute.state import new_host_keys

BASE = {"project": "proj", "zones": ["us-central1-b"], "name": "rig1", "state": "started"}


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults(op_delay=0.02, wait_max=0.5)) as server:
        yield server


def vm(fake: FakeComputeServer, known_hosts: Path, check: bool = False, **params: Any) -> dict[str, Any]:
    return run_module(fake.endpoint, check=check, **dict(BASE, known_hosts=str(known_hosts), **params))


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_new_vm_is_pinned_under_its_own_alias_and_reached_strictly(
    fake: FakeComputeServer, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "build" / "known_hosts"
    result = vm(fake, known_hosts)
    assert result["changed"] and not result.get("failed"), result
    (insert,) = fake.api.requests("POST", "/instances")
    assert {"key": "enable-guest-attributes", "value": "TRUE"} in insert["body"]["metadata"]["items"]
    # Finding 2 for Compute Engine: unless a service account is asked for, the VM runs as none.
    assert "serviceAccounts" not in insert["body"]
    assert "serviceAccounts" not in fake.api.instances[("us-central1-b", "rig1")]

    alias = f"gce/proj/us-central1-b/rig1/{result['id']}"
    published = fake.api.host_keys[result["id"]]
    assert result["host_key_alias"] == alias
    assert sorted(_lines(known_hosts)) == sorted(f"{alias} {k} {v}" for k, v in published.items())
    assert stat.S_IMODE(os.stat(known_hosts).st_mode) == 0o600
    args = result["ssh_common_args"]
    assert "-o StrictHostKeyChecking=yes" in args and f"UserKnownHostsFile={known_hosts}" in args
    assert f"HostKeyAlias={alias}" in args

    again = vm(fake, known_hosts)
    assert again["changed"] is False and again["actions"] == [], again
    assert sorted(_lines(known_hosts)) == sorted(f"{alias} {k} {v}" for k, v in published.items())


def test_other_keys_for_the_same_vm_fail_with_one_line(fake: FakeComputeServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    first = vm(fake, known_hosts)
    pinned = known_hosts.read_text()
    # Same VM id, other keys: what a man in the middle of the guest attributes, or a tampered
    # guest, would show.
    fake.api.host_keys[first["id"]]["ssh-ed25519"] = new_host_keys()["ssh-ed25519"]
    result = vm(fake, known_hosts)
    assert result.get("failed") and result["error_kind"] == "hostkeys", result
    assert "\n" not in result["msg"] and result["msg"].startswith(
        f"VM rig1 (project proj, zone us-central1-b, id {first['id']})"
    )
    assert "differ from those pinned" in result["msg"]
    assert known_hosts.read_text() == pinned


def test_a_hostile_published_value_never_reaches_known_hosts(fake: FakeComputeServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    fake.api.faults.hostkeys_delay = 3600  # create first, then publish what a hostile guest writes
    created = run_module(fake.endpoint, **dict(BASE, known_hosts=str(known_hosts), host_keys_timeout=1))
    assert created.get("failed") and created["error_kind"] == "timeout", created
    fake.api.faults.hostkeys_delay = 0
    real = fake.api.host_keys[created["id"]]["ssh-ed25519"]
    fake.api.host_keys[created["id"]]["ssh-ed25519"] = f"{real}\n* ssh-ed25519 {real}"
    result = vm(fake, known_hosts)
    assert result.get("failed") and result["error_kind"] == "hostkeys", result
    assert "published a bad host key" in result["msg"]
    assert not known_hosts.exists()


def test_keys_that_never_appear_time_out_naming_the_vm(fake: FakeComputeServer, tmp_path: Path) -> None:
    fake.api.faults.hostkeys_delay = 3600
    result = vm(fake, tmp_path / "known_hosts", host_keys_timeout=1)
    assert result.get("failed") and result["error_kind"] == "timeout", result
    assert "rig1" in result["msg"] and "published no SSH host keys" in result["msg"]
    assert "already done: insert in us-central1-b" in result["msg"]  # the VM exists: say so
    assert not (tmp_path / "known_hosts").exists()


def test_a_later_commands_read_pins_on_a_fresh_controller_without_changing_anything(
    fake: FakeComputeServer, tmp_path: Path
) -> None:
    vm(fake, tmp_path / "first" / "known_hosts")
    writes = len(fake.api.mutating_requests())
    fresh = tmp_path / "fresh" / "known_hosts"
    found = vm(fake, fresh, check=True)
    assert found["changed"] is False and not found.get("failed"), found
    assert _lines(fresh) == _lines(tmp_path / "first" / "known_hosts")
    assert len(fake.api.mutating_requests()) == writes


def test_a_vm_recreated_under_the_same_name_gets_a_new_alias(fake: FakeComputeServer, tmp_path: Path) -> None:
    """The alias holds the VM id, so an old pin never vouches for a new VM at a reused address."""
    known_hosts = tmp_path / "known_hosts"
    old = vm(fake, known_hosts)
    assert not run_module(fake.endpoint, **dict(BASE, state="absent")).get("failed")
    new = vm(fake, known_hosts)
    assert not new.get("failed") and new["id"] != old["id"], new
    assert new["host_key_alias"] != old["host_key_alias"]
    assert {line.split()[0] for line in _lines(known_hosts)} == {old["host_key_alias"], new["host_key_alias"]}


def test_guest_attributes_are_not_found_without_the_metadata(fake: FakeComputeServer) -> None:
    """The fake as the API: a VM made without enable-guest-attributes never publishes its keys."""
    made = run_module(fake.endpoint, **BASE)
    assert not made.get("failed"), made
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(
            f"{fake.endpoint}/compute/v1/projects/proj/zones/us-central1-b/instances/rig1/getGuestAttributes"
            "?queryPath=hostkeys/"
        )
    assert err.value.code == 404
