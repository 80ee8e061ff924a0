"""module_utils/vm_host_keys.py: what a guest publishes is hostile data until it is a well-formed key.

The guest attributes are written by the VM itself, so a value there could try to add a line of its
own to the controller's known_hosts (a newline, a wildcard host, a @cert-authority marker); the
alias is built from API values and must never become a pattern.
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from tests.fake_compute.harness import module_util
from tests.fake_compute.state import new_host_keys

hk = module_util("vm_host_keys")
GceError = module_util("gce_errors").GceError
VM = "VM rig1 (project proj, zone us-central1-b, id 17)"
ALIAS = "gce/proj/us-central1-b/rig1/17"


def _items(keys: dict[str, str], namespace: str = "hostkeys") -> list[dict[str, str]]:
    return [{"namespace": namespace, "key": k, "value": v} for k, v in keys.items()]


def test_published_keys_become_sorted_lines_and_other_namespaces_are_ignored() -> None:
    keys = new_host_keys()
    items = _items(keys) + _items({"ssh-ed25519": "not even base64 !"}, namespace="guestInventory")
    assert hk.keys_from_items(items, VM) == sorted(f"{k} {v}" for k, v in keys.items())


@pytest.mark.parametrize(
    "kind, value",
    [
        # A second known_hosts line smuggled in after the key.
        ("ssh-ed25519", "{ed}\n* ssh-ed25519 {ed}"),
        ("ssh-ed25519", "{ed} extra-word"),
        ("ssh-ed25519", "@cert-authority * ssh-ed25519 {ed}"),
        # A key of another type published under this type's name.
        ("ssh-ed25519", "{ecdsa}"),
        # A type that is no SSH host key type (or a pattern).
        ("*", "{ed}"),
        ("ssh-ed25519,evil", "{ed}"),
        ("ssh-ed25519", ""),
        ("ssh-ed25519", base64.b64encode(b"\xff" * 40).decode()),
    ],
)
def test_a_hostile_or_malformed_value_fails_the_run(kind: str, value: str) -> None:
    keys = new_host_keys()
    value = value.format(ed=keys["ssh-ed25519"], ecdsa=keys["ecdsa-sha2-nistp256"])
    with pytest.raises(GceError) as err:
        hk.keys_from_items(_items({kind: value}), VM)
    assert err.value.kind == "hostkeys" and str(err.value).startswith(f"{VM} published a bad host key")


@pytest.mark.parametrize("part", ["rig 1", "rig,*", "*", "!rig", "rig\nx", "", "../x"])
def test_an_alias_part_that_known_hosts_would_read_as_a_pattern_is_refused(part: str) -> None:
    with pytest.raises(GceError):
        hk.alias("gce", "proj", "us-central1-b", part, "17")


def test_pin_writes_0600_then_is_idempotent_and_keeps_other_lines(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "known_hosts"
    path.parent.mkdir()
    path.write_text("other-host ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA\n")
    keys = hk.keys_from_items(_items(new_host_keys()), VM)
    assert hk.pin(str(path), ALIAS, keys, VM) is True
    lines = path.read_text().splitlines()
    assert lines[0].startswith("other-host ") and lines[1:] == [f"{ALIAS} {k}" for k in keys]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert hk.pin(str(path), ALIAS, keys, VM) is False
    assert path.read_text().splitlines()[1:] == [f"{ALIAS} {k}" for k in keys]


def test_other_keys_for_the_same_alias_fail_naming_the_vm_and_leave_the_pin(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    first = hk.keys_from_items(_items(new_host_keys()), VM)
    hk.pin(str(path), ALIAS, first, VM)
    before = path.read_text()
    other = hk.keys_from_items(_items(new_host_keys()), VM)
    with pytest.raises(hk.HostKeyMismatch) as err:
        hk.pin(str(path), ALIAS, other, VM)
    message = str(err.value)
    assert (
        "\n" not in message and message.startswith(VM) and ALIAS in message and "man in the middle" in message
    )
    assert path.read_text() == before


def test_check_mode_pin_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    keys = hk.keys_from_items(_items(new_host_keys()), VM)
    assert hk.pin(str(path), ALIAS, keys, VM, write=False) is True
    assert not path.exists()


def test_keys_that_never_appear_end_in_a_timeout_that_says_what_to_do() -> None:
    calls = []

    def nothing_yet() -> None:
        calls.append(1)
        return None  # the API's 404 until the guest has written hostkeys/

    with pytest.raises(GceError) as err:
        hk.wait_for_keys(nothing_yet, VM, timeout=0.05, poll=0.01)
    assert err.value.kind == "timeout" and len(calls) >= 2
    assert "published no SSH host keys" in str(err.value) and "enable-guest-attributes" in str(err.value)


def test_ssh_args_accept_only_the_pinned_keys(tmp_path: Path) -> None:
    path = tmp_path / "a dir" / "known_hosts"
    args = hk.ssh_common_args(str(path), ALIAS)
    assert "-o StrictHostKeyChecking=yes" in args and "-o GlobalKnownHostsFile=/dev/null" in args
    assert f"'UserKnownHostsFile={path}'" in args  # quoted: a path with a space stays one word
    assert f"HostKeyAlias={ALIAS}" in args
