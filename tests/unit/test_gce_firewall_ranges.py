"""gce_firewall's source-range checks: what Python's ipaddress says a range means decides, and a
refused range sends no request at all (the fake Compute API's log stays empty)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_compute.harness import run_module

RULE = {"module": "gce_firewall", "project": "proj", "name": "rig-endpoint", "target_tags": ["gemma-rig"]}


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults(op_delay=0.01)) as server:
        yield server


@pytest.mark.parametrize(
    ("source_range", "needle"),
    [
        ("0.0.0.0/0", "is every IPv4 address"),
        ("0.0.0.0/00", "is every IPv4 address"),  # the same range, spelled otherwise
        ("::/0", "is every IPv6 address"),
        ("::/000", "is every IPv6 address"),
        ("0:0::/0", "is every IPv6 address"),
        ("::ffff:0.0.0.0/96", "is every IPv4 address"),  # IPv4-mapped IPv6: all of IPv4
        ("10.0.0.0/7", "broader than /8, the broadest IPv4 range allowed"),
        ("128.0.0.0/1", "broader than /8"),
        ("2001:db8::/31", "broader than /32, the broadest IPv6 range allowed"),
        ("203.0.113.7/24", "not in canonical form: write '203.0.113.0/24'"),
        ("2001:DB8::/48", "not in canonical form: write '2001:db8::/48'"),
        ("203.0.113.0/33", "is not an IPv4 or IPv6 CIDR range"),
        ("example.com/24", "is not an IPv4 or IPv6 CIDR range"),
    ],
)
def test_refused_before_any_request_naming_the_range(
    fake: FakeComputeServer, source_range: str, needle: str
) -> None:
    result = run_module(fake.endpoint, source_ranges=["198.51.100.0/24", source_range], **RULE)
    assert result.get("failed"), result
    assert needle in result["msg"] and repr(source_range) in result["msg"], result["msg"]
    assert "\n" not in result["msg"]
    assert fake.api.log == []


@pytest.mark.parametrize(
    "source_range", ["10.0.0.0/8", "203.0.113.7/32", "2001:db8::/32", "2001:db8:1:2::/64", "::ffff:a00:0/104"]
)
def test_admitted_at_or_inside_the_default_prefixes(fake: FakeComputeServer, source_range: str) -> None:
    result = run_module(fake.endpoint, source_ranges=[source_range], **RULE)
    assert not result.get("failed"), result
    assert fake.api.requests("POST", "/global/firewalls")[0]["body"]["sourceRanges"] == [source_range]


def test_the_prefix_floor_is_configurable(fake: FakeComputeServer) -> None:
    tight = run_module(fake.endpoint, source_ranges=["10.0.0.0/8"], min_prefix_v4=16, **RULE)
    assert "broader than /16" in tight["msg"] and fake.api.log == []
    loose = run_module(fake.endpoint, source_ranges=["2001:db8::/31"], min_prefix_v6=16, **RULE)
    assert not loose.get("failed"), loose


@pytest.mark.parametrize("world", ["0.0.0.0/0", "::/0"])
def test_the_world_only_when_allowed_explicitly(fake: FakeComputeServer, world: str) -> None:
    result = run_module(fake.endpoint, source_ranges=[world], allow_world=True, **RULE)
    assert not result.get("failed"), result
    assert fake.api.requests("POST", "/global/firewalls")[0]["body"]["sourceRanges"] == [world]


def test_validate_only_sends_nothing(fake: FakeComputeServer) -> None:
    ok = run_module(fake.endpoint, source_ranges=["203.0.113.0/24"], validate_only=True, **RULE)
    assert ok == {"changed": False, "source_ranges": ["203.0.113.0/24"], "invocation": ok["invocation"]}
    bad = run_module(fake.endpoint, source_ranges=["0.0.0.0/0"], validate_only=True, **RULE)
    assert "whole internet" in bad["msg"]
    assert fake.api.log == []
