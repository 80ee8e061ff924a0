"""gce_firewall against the local fake Compute API."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import ROOT, VENV_BIN
from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_compute.harness import run_module

RULE = {"module": "gce_firewall", "project": "proj", "name": "rig-endpoint", "target_tags": ["gemma-rig"]}


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults(op_delay=0.01)) as server:
        yield server


def test_rule_lifecycle(fake: FakeComputeServer) -> None:
    created = run_module(fake.endpoint, source_ranges=["203.0.113.0/24"], **RULE)
    assert created["changed"] is True, created
    body = fake.api.requests("POST", "/global/firewalls")[0]["body"]
    assert body["sourceRanges"] == ["203.0.113.0/24"] and body["targetTags"] == ["gemma-rig"]
    assert body["allowed"] == [{"IPProtocol": "tcp", "ports": ["8000"]}] and body["direction"] == "INGRESS"
    assert run_module(fake.endpoint, source_ranges=["203.0.113.0/24"], **RULE)["changed"] is False

    widened = run_module(
        fake.endpoint, diff=True, source_ranges=["203.0.113.0/24", "198.51.100.7/32"], **RULE
    )
    assert widened["changed"] is True and fake.api.requests("PATCH", "/rig-endpoint")
    assert widened["diff"]["before"]["source_ranges"] == ["203.0.113.0/24"]

    assert run_module(fake.endpoint, state="absent", **RULE)["changed"] is True
    assert fake.api.firewalls == {}
    assert run_module(fake.endpoint, state="absent", **RULE)["changed"] is False


def test_refuses_without_ranges_or_with_the_whole_internet(fake: FakeComputeServer) -> None:
    assert "source_ranges" in run_module(fake.endpoint, **RULE)["msg"]
    assert "whole internet" in run_module(fake.endpoint, source_ranges=["0.0.0.0/0"], **RULE)["msg"]
    assert fake.api.log == []


def test_check_mode_changes_nothing(fake: FakeComputeServer) -> None:
    result = run_module(fake.endpoint, check=True, source_ranges=["203.0.113.0/24"], **RULE)
    assert result["changed"] is True and fake.api.mutating_requests() == []


def test_ansible_doc_renders() -> None:
    result = subprocess.run(
        [str(VENV_BIN / "ansible-doc"), "-M", "library", "--json", "gce_firewall"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)["gce_firewall"]
    assert {"source_ranges", "target_tags", "api_endpoint"} <= set(doc["doc"]["options"])
    assert "rule" in doc["return"]
