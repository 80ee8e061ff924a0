"""gce_firewall against the local fake Compute API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.ansible_run import module_docs
from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_compute.harness import MODULES, run_module

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
    doc = module_docs("gce_firewall")["gce_firewall"]
    assert {"source_ranges", "target_tags", "api_endpoint"} <= set(doc["doc"]["options"])
    assert "rule" in doc["return"]


# ---- the fake keeps a rule as the API does (sources in tests/fake_compute/state.py) -------------
URL = "https://www.googleapis.com/compute/v1/projects/proj"
MINIMAL = {
    "name": "fw1",
    "sourceRanges": ["203.0.113.0/24"],
    "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
}


def _send(fake: FakeComputeServer, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """A raw REST call, as a client other than google-cloud-compute could make it."""
    request = urllib.request.Request(
        f"{fake.endpoint}/compute/v1/projects/proj/global/firewalls{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request) as reply:
            answer = reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    if answer[1].get("kind") == "compute#operation":
        fake.api.wait_operation(answer[1]["name"])
    return answer


def test_a_rule_read_back_has_every_server_default(fake: FakeComputeServer) -> None:
    assert _send(fake, "POST", "", MINIMAL)[0] == 200
    status, rule = _send(fake, "GET", "/fw1")  # through the server's strict check of the answer
    assert status == 200 and fake.api.mismatches == []
    assert rule["kind"] == "compute#firewall"
    assert rule["id"].isdigit() and 0 < int(rule["id"]) < 2**64
    created = datetime.fromisoformat(rule["creationTimestamp"])
    assert created.utcoffset() is not None and rule["creationTimestamp"][-6] in "+-"  # RFC 3339, offset
    assert rule["priority"] == 1000 and rule["direction"] == "INGRESS"
    assert rule["logConfig"] == {"enable": False} and rule["disabled"] is False
    assert rule["network"] == f"{URL}/global/networks/default"  # none sent: the default network
    assert rule["selfLink"] == f"{URL}/global/firewalls/fw1"
    assert set(rule) == set(MINIMAL) | {
        "kind", "id", "creationTimestamp", "network", "priority", "direction", "logConfig", "disabled", "selfLink",
    }  # fmt: skip


def test_a_patch_merges_what_it_names_and_keeps_the_rest(fake: FakeComputeServer) -> None:
    """JSON merge patch: named fields replace, null removes, objects merge, the rest stays."""
    _send(fake, "POST", "", dict(MINIMAL, targetTags=["a"], priority=900))
    before = fake.api.get_firewall("fw1")
    patch = {
        "sourceRanges": ["198.51.100.0/24"],
        "targetTags": None,
        "logConfig": {"metadata": "INCLUDE_ALL_METADATA"},
    }
    assert _send(fake, "PATCH", "/fw1", patch)[0] == 200
    after = fake.api.get_firewall("fw1")
    assert after["sourceRanges"] == ["198.51.100.0/24"] and "targetTags" not in after
    assert after["logConfig"] == {"enable": False, "metadata": "INCLUDE_ALL_METADATA"}
    kept = ("id", "creationTimestamp", "priority", "allowed", "direction", "disabled", "network")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # Misspelt: sourceRanges, IPProtocol, logConfig.enable.
        ({"sourceRange": ["203.0.113.0/24"]},
         "Invalid JSON payload received. Unknown name \"sourceRange\" at 'resource': Cannot find field."),
        ({"allowed": [{"IPProtocoll": "tcp"}]},
         "Invalid JSON payload received. Unknown name \"IPProtocoll\" at 'resource.allowed[0]': Cannot find field."),
        ({"logConfig": {"enabled": True}},
         "Invalid JSON payload received. Unknown name \"enabled\" at 'resource.logConfig': Cannot find field."),
        ({"allowed": [{"ports": ["22"]}]},
         "Invalid value for field 'resource.allowed[0].IPProtocol': ''. Invalid IP protocol specification."),
        ({"name": "Rig_1"}, "Invalid value for field 'resource.name': 'Rig_1'. Must be a match of regex "
                            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"),
        ({"direction": "INGRES"}, "Invalid value for field 'resource.direction': 'INGRES'."),
        ({"priority": 65536}, "Invalid value for field 'resource.priority': '65536'."),
    ],
)  # fmt: skip
def test_the_fake_refuses_a_rule_the_api_refuses(fake: FakeComputeServer, change: dict, message: str) -> None:
    status, answer = _send(fake, "POST", "", dict(MINIMAL, **change))
    assert status == 400 and answer["error"]["message"].startswith(message), answer
    assert fake.api.firewalls == {} and fake.api.operations == {}


def test_a_patch_with_a_misspelt_field_is_refused_and_changes_nothing(fake: FakeComputeServer) -> None:
    _send(fake, "POST", "", MINIMAL)
    before = fake.api.get_firewall("fw1")
    status, answer = _send(fake, "PATCH", "/fw1", {"targetTag": ["b"]})
    assert status == 400 and 'Unknown name "targetTag"' in answer["error"]["message"]
    assert fake.api.get_firewall("fw1") == before


def test_a_misspelt_field_sent_by_the_module_is_refused_in_one_line(
    fake: FakeComputeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body the client serialised with a misspelt field (as a stale schema would): the API's 400,
    and the module's report is that one line, naming the field."""
    from google.cloud.compute_v1.services.firewalls.transports.rest import FirewallsRestTransport

    real = FirewallsRestTransport._Insert._get_response

    def misspelt(*args: Any) -> Any:  # (host, metadata, query, session, timeout, request, body)
        sent = json.loads(args[-1])
        sent["sourceRange"] = sent.pop("sourceRanges")
        return real(*args[:-1], json.dumps(sent))

    monkeypatch.setattr(FirewallsRestTransport._Insert, "_get_response", staticmethod(misspelt))
    result = run_module(fake.endpoint, source_ranges=["203.0.113.0/24"], **RULE)
    assert result.get("failed") is True and result["error_kind"] == "api", result
    assert not result.get("changed")
    assert "\n" not in result["msg"] and result["msg"].startswith("Compute API error 400: "), result["msg"]
    assert result["msg"].endswith(
        "Invalid JSON payload received. Unknown name \"sourceRange\" at 'resource': Cannot find field."
    )
    assert fake.api.firewalls == {} and len(fake.api.requests("POST", "/global/firewalls")) == 1


def test_idempotent_with_the_server_defaults_present(fake: FakeComputeServer) -> None:
    """The rule read back carries what the API adds (priority, direction, logConfig, disabled, id,
    URLs); none of it is a difference, and a change still shows in check and diff mode."""
    ranges = ["203.0.113.0/24"]
    assert run_module(fake.endpoint, source_ranges=ranges, **RULE)["changed"] is True
    stored = fake.api.get_firewall("rig-endpoint")
    assert (stored["priority"], stored["direction"], stored["disabled"]) == (1000, "INGRESS", False)
    assert stored["logConfig"] == {"enable": False} and stored["network"].startswith("https://")

    again = run_module(fake.endpoint, diff=True, source_ranges=ranges, **RULE)
    assert again["changed"] is False and not again.get("failed"), again
    assert again["diff"]["before"] == again["diff"]["after"]
    assert again["diff"]["before"]["network"] == "default"
    assert not fake.api.requests("PATCH") and len(fake.api.requests("POST", "/global/firewalls")) == 1
    assert run_module(fake.endpoint, check=True, source_ranges=ranges, **RULE)["changed"] is False

    log_size = len(fake.api.mutating_requests())
    wider = [*ranges, "198.51.100.0/24"]
    checked = run_module(fake.endpoint, check=True, diff=True, source_ranges=wider, **RULE)
    assert checked["changed"] is True and len(fake.api.mutating_requests()) == log_size
    assert checked["diff"]["before"]["source_ranges"] == ranges
    assert checked["diff"]["after"]["source_ranges"] == sorted(wider)

    # What someone set by hand outside the module's fields survives its patch (merge patch).
    fake.api.firewalls["rig-endpoint"].update(priority=900, logConfig={"enable": True})
    assert run_module(fake.endpoint, source_ranges=wider, **RULE)["changed"] is True
    patched = fake.api.get_firewall("rig-endpoint")
    assert patched["sourceRanges"] == sorted(wider) and patched["priority"] == 900
    assert patched["logConfig"] == {"enable": True}
    assert (patched["id"], patched["creationTimestamp"]) == (stored["id"], stored["creationTimestamp"])
    assert run_module(fake.endpoint, source_ranges=wider, **RULE)["changed"] is False
    assert fake.api.mismatches == []


# ---- emptying a list the module owns: firewalls.update (PUT), as a merge patch cannot ------------
# The client writes no empty list, so a patch for target_tags: [] would carry no targetTags and
# leave the old tags in place.
UNTAGGED = dict(RULE, target_tags=[], source_ranges=["203.0.113.0/24"])


def test_emptied_target_tags_are_cleared(fake: FakeComputeServer) -> None:
    assert run_module(fake.endpoint, source_ranges=["203.0.113.0/24"], **RULE)["changed"] is True
    tagged = fake.api.get_firewall("rig-endpoint")
    assert tagged["targetTags"] == ["gemma-rig"]

    cleared = run_module(fake.endpoint, diff=True, **UNTAGGED)
    assert cleared["changed"] is True and not cleared.get("failed"), cleared
    assert (
        cleared["diff"]["before"]["target_tags"] == ["gemma-rig"]
        and cleared["diff"]["after"]["target_tags"] == []
    )
    rule = fake.api.get_firewall("rig-endpoint")
    assert "targetTags" not in rule and rule["sourceRanges"] == ["203.0.113.0/24"]
    assert (rule["id"], rule["creationTimestamp"]) == (tagged["id"], tagged["creationTimestamp"])
    (put,) = fake.api.requests("PUT", "/global/firewalls/rig-endpoint")
    assert put["body"]["name"] == "rig-endpoint" and "targetTags" not in put["body"]
    assert not fake.api.requests("PATCH")

    again = run_module(fake.endpoint, **UNTAGGED)
    assert again["changed"] is False and not again.get("failed"), again
    assert len(fake.api.requests("PUT")) == 1 and fake.api.mismatches == []


def test_check_mode_reports_the_clearing_and_sends_nothing(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, source_ranges=["203.0.113.0/24"], **RULE)
    log_size = len(fake.api.mutating_requests())
    checked = run_module(fake.endpoint, check=True, diff=True, **UNTAGGED)
    assert checked["changed"] is True and checked["diff"]["after"]["target_tags"] == []
    assert len(fake.api.mutating_requests()) == log_size
    assert fake.api.get_firewall("rig-endpoint")["targetTags"] == ["gemma-rig"]
    # What check mode said is what the run does: after it, check mode has nothing left to change.
    assert run_module(fake.endpoint, **UNTAGGED)["changed"] is True
    assert run_module(fake.endpoint, check=True, **UNTAGGED)["changed"] is False


def test_the_update_keeps_what_was_set_outside_the_module(fake: FakeComputeServer) -> None:
    """A PUT replaces the whole rule: the module carries over every field it does not own."""
    run_module(fake.endpoint, source_ranges=["203.0.113.0/24"], **RULE)
    fake.api.firewalls["rig-endpoint"].update(
        priority=900, logConfig={"enable": True}, sourceTags=["bastion"], disabled=True
    )
    assert run_module(fake.endpoint, **UNTAGGED)["changed"] is True
    rule = fake.api.get_firewall("rig-endpoint")
    assert "targetTags" not in rule
    assert (rule["priority"], rule["logConfig"], rule["sourceTags"]) == (900, {"enable": True}, ["bastion"])
    assert rule["disabled"] is True and rule["description"] == "Managed by gemma-rig"
    assert fake.api.mismatches == []


@pytest.mark.parametrize(
    ("current", "wanted", "update"),
    [
        ({"targetTags": ["a"]}, {"target_tags": [], "source_ranges": []}, True),
        ({"sourceRanges": ["203.0.113.0/24"]}, {"target_tags": [], "source_ranges": []}, True),
        (
            {"targetTags": ["a"]},
            {"target_tags": ["b"], "source_ranges": []},
            False,
        ),  # a patch replaces a list
        ({}, {"target_tags": [], "source_ranges": []}, False),
    ],
)
def test_only_an_emptied_list_takes_an_update(current: dict, wanted: dict, update: bool) -> None:
    """source_ranges cannot be wanted empty while the rule is present, so it is checked here."""
    assert MODULES["gce_firewall"].emptied(current, wanted) is update


def test_a_put_replaces_the_rule_whole(fake: FakeComputeServer) -> None:
    """firewalls.update: "all fields will be updated if using PUT, even fields that are not
    specified": what the body leaves out goes back to the server's default, output-only fields stay."""
    _send(fake, "POST", "", dict(MINIMAL, targetTags=["a"], priority=900, logConfig={"enable": True}))
    before = fake.api.get_firewall("fw1")
    body = dict(MINIMAL, sourceRanges=["198.51.100.0/24"], id="1", kind="compute#firewall")
    status, op = _send(fake, "PUT", "/fw1", body)
    assert status == 200 and op["operationType"] == "update", op
    after = fake.api.get_firewall("fw1")
    assert after["sourceRanges"] == ["198.51.100.0/24"] and "targetTags" not in after
    assert (after["priority"], after["logConfig"]) == (1000, {"enable": False})
    assert {k: after[k] for k in ("id", "creationTimestamp", "selfLink", "kind")} == {
        k: before[k] for k in ("id", "creationTimestamp", "selfLink", "kind")
    }
    assert fake.api.mismatches == []


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/fw1", dict(MINIMAL, name="fw2"), 400, "Invalid value for field 'resource.name': 'fw2'."),
        ("/fw1", {k: v for k, v in MINIMAL.items() if k != "name"}, 400,
         "Invalid value for field 'resource.name': ''."),
        ("/fw1", dict(MINIMAL, targetTag=["b"]), 400,
         "Invalid JSON payload received. Unknown name \"targetTag\" at 'resource': Cannot find field."),
        ("/fw1", dict(MINIMAL, priority=65536), 400, "Invalid value for field 'resource.priority': '65536'."),
        ("/nope", dict(MINIMAL, name="nope"), 404, "The resource 'projects/proj/global/firewalls/nope' was not found"),
    ],
)  # fmt: skip
def test_a_refused_put_changes_nothing(
    fake: FakeComputeServer, path: str, body: dict, status: int, message: str
) -> None:
    _send(fake, "POST", "", MINIMAL)
    before = fake.api.get_firewall("fw1")
    operations = len(fake.api.operations)
    got, answer = _send(fake, "PUT", path, body)
    assert got == status and answer["error"]["message"].startswith(message), answer
    assert fake.api.firewalls == {"fw1": before} and len(fake.api.operations) == operations
