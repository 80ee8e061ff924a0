"""SSH host keys of a new cloud VM, read from its guest attributes and pinned in a known_hosts file.

Cloud VMs get ephemeral addresses, so "whoever answers at that address" is no identity: the first
SSH connection would hand the HF token, the TLS key and root to it. The guest environment of a
Compute Engine image (and of a TPU VM) publishes the VM's host keys as guest attributes
(namespace ``hostkeys``, one key per type), which the controller reads over the authenticated
cloud API: a trusted channel. The keys are written under a HostKeyAlias that names the VM by
project, zone, name and id, so an address reused by another VM (or a VM recreated under the same
name) never matches a pin it does not own.

Everything here treats the guest attributes as hostile data: the guest writes them, so a value is
accepted only when it is a well-formed SSH public key blob of the type it claims.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import shlex
import struct
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

from ansible.module_utils.gce_errors import GceError

NAMESPACE = "hostkeys"
QUERY_PATH = "hostkeys/"
KEY_TYPES = frozenset(
    {"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa"}
)
_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# One alias part: what project ids, zones, VM names and numeric ids are made of; no whitespace,
# comma or wildcard, which known_hosts would read as a separator or a pattern.
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_MAX_BLOB = 16384  # an RSA-16384 key is under 2.1 kB; anything bigger is not a host key


class HostKeyMismatch(GceError):
    """The VM's published key differs from the one pinned for the same VM."""


def alias(*parts: str) -> str:
    """The HostKeyAlias for a VM, e.g. ``gce/my-project/us-central1-b/rig-1/8123``."""
    for part in parts:
        if not _PART.fullmatch(str(part)):
            raise GceError("invalid", f"cannot name a host key alias after {part!r}: unexpected characters")
    return "/".join(str(p) for p in parts)


def _blob_type(value: str) -> str:
    """The key type written inside an SSH public key blob (its first length-prefixed string)."""
    blob = base64.b64decode(value, validate=True)
    if len(blob) > _MAX_BLOB or len(blob) < 4:
        raise ValueError("wrong size")
    (length,) = struct.unpack(">I", blob[:4])
    if length > 64 or len(blob) < 4 + length:
        raise ValueError("no key type")
    return blob[4 : 4 + length].decode("ascii")


def keys_from_items(items: Iterable[dict[str, Any]], vm: str) -> list[str]:
    """``type base64`` lines from guest attribute entries (namespace, key, value), sorted.

    Entries of other namespaces are ignored; a hostkeys entry that is not a well-formed key of the
    type it names fails the run: the guest may be lying, and a partial pin would hide that.
    """
    out = set()
    for item in items:
        if item.get("namespace") != NAMESPACE:
            continue
        kind, value = str(item.get("key", "")), str(item.get("value", "")).strip()
        problem = ""
        if kind not in KEY_TYPES:
            problem = f"unknown key type {kind[:40]!r}"
        elif not _B64.fullmatch(value):
            problem = f"{kind} value is not one base64 word"
        else:
            try:
                inner = _blob_type(value)
            except (ValueError, binascii.Error, UnicodeDecodeError, struct.error):
                inner = ""
            if inner != kind:
                problem = f"{kind} value is not an SSH {kind} public key"
        if problem:
            raise GceError("hostkeys", f"{vm} published a bad host key in its guest attributes ({problem})")
        out.add(f"{kind} {value}")
    return sorted(out)


def wait_for_keys(
    fetch: Callable[[], list[dict[str, Any]] | None], vm: str, timeout: float, poll: float
) -> list[str]:
    """Poll ``fetch`` (guest attribute entries, or None while there are none) until host keys appear."""
    deadline = time.monotonic() + timeout
    while True:
        keys = keys_from_items(fetch() or [], vm)
        if keys:
            return keys
        if time.monotonic() >= deadline:
            raise GceError(
                "timeout",
                f"{vm} published no SSH host keys in its guest attributes ({QUERY_PATH}) within "
                f"{timeout:g}s: its image's guest environment writes them at boot when the metadata "
                "enable-guest-attributes is TRUE; raise host_keys_timeout, or check the VM's serial "
                "console for the guest agent",
            )
        time.sleep(poll)


def _read(path: str) -> list[str]:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        return []


def pin(path: str, key_alias: str, keys: list[str], vm: str, write: bool = True) -> bool:
    """Make ``path`` hold ``keys`` for ``key_alias``; True when lines were (or would be) added.

    A different key set already pinned for the same alias raises HostKeyMismatch: the alias holds
    the VM's id, so the same alias means the same VM, whose keys should not change.
    """
    lines = _read(path)
    pinned = sorted(" ".join(line.split()[1:3]) for line in lines if line.split()[:1] == [key_alias])
    if pinned == keys:
        return False
    if pinned:
        raise HostKeyMismatch(
            "hostkeys",
            f"{vm}: the SSH host keys it publishes differ from those pinned for it in {path} under "
            f"{key_alias}; a recreated VM has a new id and alias, so this is the same VM with new "
            "keys: suspect a man in the middle or a tampered guest, and delete those lines only "
            "once you know why",
        )
    if write:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        text = "".join(f"{line}\n" for line in lines) + "".join(f"{key_alias} {key}\n" for key in keys)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".known_hosts.")  # 0600 from mkstemp
        try:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    return True


def ssh_common_args(path: str, key_alias: str) -> str:
    """The ssh options that make the connection accept exactly the pinned keys of this VM."""
    return " ".join(
        [
            "-o",
            shlex.quote(f"UserKnownHostsFile={os.path.abspath(path)}"),
            "-o GlobalKnownHostsFile=/dev/null",
            "-o StrictHostKeyChecking=yes",
            "-o",
            shlex.quote(f"HostKeyAlias={key_alias}"),
        ]
    )
