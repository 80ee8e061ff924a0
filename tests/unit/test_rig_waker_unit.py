"""rig-waker's systemd unit (roles/gateway/templates/rig-waker.service.j2) per gateway platform: its
own dynamic user on a VM; a fixed unprivileged user in the local platform's podman container, whose
systemd cannot set up a dynamic user (226/NAMESPACE), with the rest of the hardening unchanged."""

from __future__ import annotations

import jinja2
import pytest

from tests.conftest import ROOT

TEMPLATE = ROOT / "roles" / "gateway" / "templates" / "rig-waker.service.j2"


def render(platform: str) -> dict[str, list[str]]:
    """The unit's settings as {key: [values]} for gateway_platform ``platform``."""
    text = (
        jinja2.Environment(undefined=jinja2.StrictUndefined)
        .from_string(TEMPLATE.read_text())
        .render(
            ansible_managed="managed",
            gateway_platform=platform,
            gateway_wake_token="t",
            _gateway_wake_bin="/usr/local/libexec/gemma-rig/rig-waker",
            _gateway_wake_config="/etc/haproxy/gemma-gateway/rig-waker.json",
            _gateway_wake_token_file="/etc/haproxy/gemma-gateway/rig-waker.token",
        )
    )
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


@pytest.mark.parametrize("platform", ["", "gce"])
def test_a_vm_gateway_runs_rig_waker_as_its_own_dynamic_user(platform: str) -> None:
    unit = render(platform)
    assert unit["DynamicUser"] == ["yes"]
    assert "User" not in unit


def test_the_local_gateway_runs_it_as_nobody_with_the_same_hardening() -> None:
    local, vm = render("local"), render("gce")
    assert "DynamicUser" not in local
    assert local["User"] == ["nobody"] and local["Group"] == ["nogroup"]
    # What DynamicUser= implies, spelled out; every other setting as on a VM.
    assert local["RemoveIPC"] == ["yes"] and local["RestrictSUIDSGID"] == ["yes"]
    shared = {k: v for k, v in local.items() if k not in ("User", "Group", "RemoveIPC", "RestrictSUIDSGID")}
    assert shared == {k: v for k, v in vm.items() if k != "DynamicUser"}
    assert local["ProtectSystem"] == ["strict"] and local["NoNewPrivileges"] == ["yes"]
    assert local["CapabilityBoundingSet"] == [""]
