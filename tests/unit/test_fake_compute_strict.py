"""The Compute fake's answers are held to the real client's types, and its errors are the API's own.

The released client ignores fields it does not know, so these tests show that a misspelt or
wrongly typed field in an answer fails loudly (a 500 naming it) instead of passing unseen.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from tests.fake_compute import FakeComputeServer, strict
from tests.fake_compute.harness import MODULES, module_util, run_module
from tests.fake_compute.state import FakeCompute

make_retry = module_util("gce_retry").make_retry
ZONE = "us-central1-a"
VM = {"project": "p", "name": "vm1", "zones": [ZONE]}


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer() as server:
        yield server


def _client(cls: Any, endpoint: str) -> Any:
    return cls(credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=endpoint),
               transport="rest")  # fmt: skip


def test_a_vm_lifecycle_sends_only_what_the_api_sends(fake: FakeComputeServer) -> None:
    """Create, stop, start and delete through the real module: every answer passed the check."""
    for state in ("present", "stopped", "present", "absent"):
        result = run_module(fake.endpoint, state=state, **VM)
        assert not result.get("failed"), result
    listed = _client(compute_v1.InstancesClient, fake.endpoint).list(project="p", zone=ZONE)
    assert list(listed) == []
    assert len(fake.api.log) > 8
    assert fake.api.mismatches == []


def misspell(monkeypatch: pytest.MonkeyPatch, getter: str, field: str, wrong: str) -> None:
    """Make the fake's ``getter`` answer with ``field`` spelt ``wrong`` (a field the API never sends)."""
    real_get = getattr(FakeCompute, getter)

    def misspelt(self: FakeCompute, *args: Any, **kwargs: Any) -> dict[str, Any]:
        answer = real_get(self, *args, **kwargs)
        answer[wrong] = answer.pop(field)
        return answer

    monkeypatch.setattr(FakeCompute, getter, misspelt)


def test_a_misspelt_answer_field_fails_the_module_naming_it(
    fake: FakeComputeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_module(fake.endpoint, **VM)
    misspell(monkeypatch, "get_instance", "status", "statuss")
    result = run_module(fake.endpoint, retry_deadline=0.2, **VM)
    assert result.get("failed"), result
    assert "statuss" in result["msg"]
    assert (
        fake.api.mismatches and "Instance" in fake.api.mismatches[0] and "statuss" in fake.api.mismatches[0]
    )


def test_a_misspelt_firewall_answer_fails_the_module_naming_it(
    fake: FakeComputeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    rule = {"module": "gce_firewall", "project": "p", "name": "fw1", "source_ranges": ["203.0.113.0/24"]}
    assert run_module(fake.endpoint, **rule)["changed"] is True
    misspell(monkeypatch, "get_firewall", "sourceRanges", "sourceRange")
    # gce_firewall has no retry options: the 500 is retried until a short deadline, not two minutes.
    monkeypatch.setattr(MODULES["gce_firewall"], "make_retry", lambda: make_retry(initial=0.01, deadline=0.2))
    result = run_module(fake.endpoint, **rule)
    assert result.get("failed") and "sourceRange" in result["msg"] and "\n" not in result["msg"], result
    assert fake.api.mismatches and all(m.startswith("Firewall: ") for m in fake.api.mismatches)
    assert not fake.api.requests("PATCH")  # the module never acted on the answer


@pytest.mark.parametrize(
    ("message", "body", "named"),
    [
        ("Instance", {"statuss": "RUNNING"}, "statuss"),
        ("Instance", {"machine_type": "x"}, "machine_type"),  # the client's Parse takes the proto name
        ("Instance", {"id": 1234}, "Instance.id"),  # uint64: a JSON string in the API
        ("Instance", {"status": "RUNING"}, "Instance.status"),  # not an Instance.Status name
        ("Instance", {"disks": [{"boot": "true"}]}, "boot"),
        ("Instance", {"labels": {}}, "Instance.labels"),  # the API leaves an empty map out
        ("InstanceList", {"kind": "compute#instanceList", "items": []}, "InstanceList.items"),
        ("Operation", {"kind": "compute#instance"}, "Operation.kind"),
        ("Operation", {"progress": "100"}, "Operation.progress"),
        ("Operation", {"error": {"errors": [{"code": "X", "errorDetail": []}]}}, "errorDetail"),
        ("Scheduling", {"onHostMaintenance": "MIGRATE", "provisioningModel": "SPOTT"}, "provisioningModel"),
        ("Firewall", {"sourceRange": ["203.0.113.0/24"]}, "sourceRange"),
        ("Firewall", {"allowed": [{"IPProtocoll": "tcp"}]}, "IPProtocoll"),
        ("Firewall", {"logConfig": {"enabled": False}}, "enabled"),
        ("Firewall", {"source_ranges": ["203.0.113.0/24"]}, "source_ranges"),
        ("Firewall", {"direction": "INGRES"}, "Firewall.direction"),  # not a Firewall.Direction name
        ("Firewall", {"id": 1234}, "Firewall.id"),  # uint64: a JSON string in the API
        ("Firewall", {"priority": "1000"}, "Firewall.priority"),  # int32: a JSON number
        ("Firewall", {"disabled": "false"}, "disabled"),
        ("Firewall", {"kind": "compute#firewalls"}, "Firewall.kind"),
    ],
)
def test_an_answer_the_api_would_never_send_is_refused(
    message: str, body: dict[str, Any], named: str
) -> None:
    with pytest.raises(strict.ResponseMismatch, match=named.replace(".", r"\.")):
        strict.check_message(message, body)


@pytest.mark.parametrize(
    ("status", "body", "named"),
    [
        (404, {"error": {"code": 404, "message": "m"}}, "error.errors"),
        (404, {"error": {"code": 400, "message": "m", "errors": [{"message": "m", "domain": "global", "reason": "r"}]}},
         "error.code"),
        (404, {"error": {"code": 404, "message": "m", "errors": [{"message": "m", "domain": "global"}]}},
         "reason"),
        (404, {"error": {"code": 404, "message": "m", "errors": [{"message": "m", "domain": "global", "reason": "r",
                                                                  "reasons": "r"}]}}, "reasons"),
        (404, {"error": {"code": 404, "message": "m", "status": "NOTFOUND",
                         "errors": [{"message": "m", "domain": "global", "reason": "r"}]}}, "error.status"),
        (404, {"message": "m"}, "error body"),
    ],
)  # fmt: skip
def test_an_error_not_in_the_apis_format_is_refused(status: int, body: dict[str, Any], named: str) -> None:
    with pytest.raises(strict.ResponseMismatch, match=named.replace(".", r"\.")):
        strict.check_error(status, body)


def test_not_found_and_already_exists_name_the_full_resource(fake: FakeComputeServer) -> None:
    """The messages the API sends: the resource from projects/ on (sources in state.py)."""
    instances = _client(compute_v1.InstancesClient, fake.endpoint)
    with pytest.raises(exceptions.NotFound) as missing:
        instances.get(project="p", zone=ZONE, instance="nope")
    assert missing.value.message.endswith(
        f": The resource 'projects/p/zones/{ZONE}/instances/nope' was not found"
    )
    assert missing.value.errors[0]["reason"] == "notFound"
    firewalls = _client(compute_v1.FirewallsClient, fake.endpoint)
    with pytest.raises(exceptions.NotFound) as no_rule:
        firewalls.get(project="p", firewall="nope")
    assert no_rule.value.message.endswith(": The resource 'projects/p/global/firewalls/nope' was not found")
    rule = compute_v1.Firewall(name="fw1", network="global/networks/default", source_ranges=["10.0.0.0/8"],
                               allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])])  # fmt: skip
    firewalls.insert(project="p", firewall_resource=rule).result()
    with pytest.raises(exceptions.Conflict) as twice:
        firewalls.insert(project="p", firewall_resource=rule)
    assert twice.value.message.endswith(": The resource 'projects/p/global/firewalls/fw1' already exists")
    assert fake.api.mismatches == []


def test_a_stockout_carries_the_apis_error_details(fake: FakeComputeServer) -> None:
    fake.api.faults.stockout_zones.add(ZONE)
    result = run_module(fake.endpoint, **VM)
    assert result.get("failed")
    op = next(o for o in fake.api.operations.values() if o.get("error"))
    (error,) = op["error"]["errors"]
    assert error["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
    assert error["message"].endswith("does not have enough resources available to fulfill the request.  "
                                     "'(resource type:compute)'.")  # fmt: skip
    assert [next(iter(d)) for d in error["errorDetails"]] == ["help", "localizedMessage", "errorInfo"]
    assert fake.api.mismatches == []
