"""The gce role checks a rig's VPC-only endpoint ranges (one list) before any request, and gives each
VM its own tag for its endpoint rule.

provision_gce.yml against the fake Compute API, as tests/test_gce_playbooks.py runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.fake_compute import FakeComputeServer
from tests.test_gce_playbooks import _play, fake, inventory  # noqa: F401  # fixtures

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

KEY = "sk-test-0123456789abcdef"


def _vars(tmp_path: Path, ranges: list[str], **more: object) -> str:
    """An extra-vars file standing in for the inventory plus an ansible-vault file."""
    path = tmp_path / "vars.yml"
    path.write_text(yaml.safe_dump({"rig_api_key": KEY, "rig_endpoint_source_ranges": ranges, **more}))
    return f"@{path}"


@pytest.mark.parametrize(
    ("source_range", "needle"),
    [
        ("0.0.0.0/00", "'0.0.0.0/00' is every IPv4 address"),
        ("::/0", "'::/0' is every IPv6 address"),
        ("10.0.0.0/6", "'10.0.0.0/6' is broader than /8"),
    ],
)
def test_a_bad_range_is_refused_before_any_request(
    fake: FakeComputeServer,  # noqa: F811
    inventory: Path,  # noqa: F811
    tmp_path: Path,
    source_range: str,
    needle: str,
) -> None:
    result = _play(
        "playbooks/provision_gce.yml", inventory, fake, "-e", "gce_internal_endpoint=true",
        "-e", _vars(tmp_path, ["198.51.100.0/24", source_range]),
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert needle in out
    assert fake.api.log == []  # not even a read: the VM was never looked up
    assert KEY not in out


def test_a_rig_open_to_the_world_is_refused_even_when_allowed(
    fake: FakeComputeServer,  # noqa: F811
    inventory: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    # gce_endpoint_allow_world admits a gateway VM's TLS port to everyone; never a rig's plain HTTP.
    result = _play(
        "playbooks/provision_gce.yml", inventory, fake, "-e", "gce_open_endpoint=true",
        "-e", _vars(tmp_path, ["0.0.0.0/0", "::/0"], gce_endpoint_allow_world=True),
    )  # fmt: skip
    assert result.returncode == 2 and "plain HTTP" in result.stdout, result.stdout[-4000:]
    assert fake.api.log == [] and fake.api.firewalls == {}


def test_the_vpc_only_endpoint_makes_no_rule_and_the_vm_carries_its_own_tag(
    fake: FakeComputeServer,  # noqa: F811
    inventory: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    # rig_endpoint_source_ranges is the one place: the unit renders IPAddressAllow from it
    # (tests/unit/test_vllm_unit_filter.py); the VPC's own rules admit the gateway.
    result = _play(
        "playbooks/provision_gce.yml", inventory, fake, "-e", "gce_internal_endpoint=true",
        "-e", _vars(tmp_path, ["10.128.0.5/32"]),
    )  # fmt: skip
    assert "TASK [gce : Wait for SSH on the VM]" in result.stdout, result.stdout[-4000:]
    assert fake.api.firewalls == {}
    assert fake.api.requests("POST", "/instances")[-1]["body"]["tags"]["items"] == ["gemma-rig", "rig-test"]
