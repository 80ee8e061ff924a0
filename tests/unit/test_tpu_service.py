"""tpu_node against the fake Cloud TPU API where the service's behaviour is easy to get wrong: which
quota flex-start uses, how a zone says it lacks an accelerator, a request's expiry, quota errors
whose URL holds "rate", a create operation that fails, operations polled on their own version,
every state of the installed enums, and a fake that cannot answer what the service cannot."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from google.cloud import tpu_v2, tpu_v2alpha1

from tests.fake_compute.harness import module_util, run_module
from tests.fake_tpu import FakeTpuServer, Faults
from tests.fake_tpu.state import CAPACITY, NOT_OFFERED
from tests.unit.test_tpu_node import BASE, QUOTA, QUOTA_PREEMPTIBLE


@pytest.fixture
def fake() -> Iterator[FakeTpuServer]:
    with FakeTpuServer(Faults(op_delay=0.02, provision_delay=0.1)) as server:
        yield server
        assert server.api.strict_errors == []  # every answer parsed as the real type


def tpu(fake: FakeTpuServer, **params: Any) -> dict[str, Any]:
    return partial(run_module, fake.endpoint, module="tpu_node")(**dict(BASE, **params))


def _http(fake: FakeTpuServer, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{fake.endpoint}{path}", data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _creates(fake: FakeTpuServer) -> list[dict[str, Any]]:
    return fake.api.requests("POST", "/queuedResources")


# ---- quota per provisioning model --------------------------------------------------------------
def test_the_quota_table_charges_flex_start_to_the_preemptible_quota() -> None:
    assert module_util("tpu_api").QUOTAS == {
        "on-demand": QUOTA,
        "spot": QUOTA_PREEMPTIBLE,
        "flex-start": QUOTA_PREEMPTIBLE,
    }


@pytest.mark.parametrize("at_create", [True, False])
def test_flex_start_fails_on_the_preemptible_quota(fake: FakeTpuServer, at_create: bool) -> None:
    fake.api.faults.quota_zero = {QUOTA_PREEMPTIBLE}
    fake.api.faults.quota_at_create = at_create
    result = tpu(fake, provisioning_model="flex-start")
    assert result.get("failed") and result["error_kind"] == "quota", result
    assert result["quota"] == QUOTA_PREEMPTIBLE and not fake.api.queued


def test_flex_start_does_not_need_on_demand_quota(fake: FakeTpuServer) -> None:
    fake.api.faults.quota_zero = {QUOTA}
    result = tpu(fake, provisioning_model="flex-start")
    assert not result.get("failed") and result["state"] == "READY", result


# ---- "not offered in this zone", in the service's words ----------------------------------------
@pytest.mark.parametrize("wording", sorted(NOT_OFFERED))
def test_a_zone_without_the_accelerator_sends_the_module_to_the_next(
    fake: FakeTpuServer, wording: str
) -> None:
    fake.api.faults.not_offered = {"us-west4-a": wording}
    result = tpu(fake)
    assert not result.get("failed") and result["zone"] == "us-east1-c", result
    first = result["zones_tried"][0]
    assert first["zone"] == "us-west4-a" and first["result"] == "unsupported"
    assert NOT_OFFERED[wording].format(accel="v5litepod-1", zone="us-west4-a") in first["reason"]


# ---- a request's lifetime -----------------------------------------------------------------------
def test_the_fake_expires_a_request_still_waiting_at_its_valid_until(fake: FakeTpuServer) -> None:
    fake.api.faults.waiting_zones = {"us-west4-a"}
    spec = {"parent": "projects/proj/locations/us-west4-a", "nodeId": "n1",
            "node": {"acceleratorType": "v5litepod-1", "runtimeVersion": "v2-alpha-tpuv5-lite"}}  # fmt: skip
    body = {"tpu": {"nodeSpec": [spec]}, "queueingPolicy": {"validUntilDuration": "1s"}}
    path = "/v2alpha1/projects/proj/locations/us-west4-a/queuedResources"
    assert _http(fake, "POST", f"{path}?queuedResourceId=n1", body)[0] == 200
    states = []
    for _ in range(100):  # until it changes; the loop bound only keeps a broken fake from hanging
        state = _http(fake, "GET", f"{path}/n1")[1]["state"]
        states.append(state["state"])
        if state["state"] not in ("CREATING", "WAITING_FOR_RESOURCES"):
            break
        time.sleep(0.05)
    assert "WAITING_FOR_RESOURCES" in states and states[-1] == "FAILED", states
    assert state["failedData"]["error"]["code"] == 4


def test_the_request_outlives_the_modules_wait(fake: FakeTpuServer) -> None:
    """The service counts validUntil from the create; the module's zone_wait starts after the create
    operation is done. A lifetime of zone_wait would expire into FAILED before the module moves on."""
    fake.api.faults.waiting_zones = {"us-west4-a"}
    fake.api.faults.op_delay = 1.0
    result = tpu(fake, zone_wait=1)
    assert not result.get("failed") and result["zone"] == "us-east1-c", result
    assert result["zones_tried"][0]["result"] == "stockout"
    assert "WAITING_FOR_RESOURCES" in result["zones_tried"][0]["reason"]
    sent = _creates(fake)[0]["body"]["queueingPolicy"]["validUntilDuration"]
    assert sent == f"{1 + 20 + 60}s"  # zone_wait + operation_timeout + a minute
    assert ("us-west4-a", "tpu1") not in fake.api.queued


# ---- quota versus throttling ---------------------------------------------------------------------
@pytest.mark.parametrize("params", [{"project": "corporate-ml"}, {"name": "generate-ai"}])
def test_a_quota_error_is_a_quota_whatever_the_names_in_its_url(fake: FakeTpuServer, params: dict) -> None:
    fake.api.faults.quota_zero = {QUOTA}
    result = tpu(fake, **params)
    assert result.get("failed") and result["error_kind"] == "quota" and result["quota"] == QUOTA, result
    assert len(_creates(fake)) == 1  # not retried as throttling


def test_throttling_marked_as_a_rate_limit_is_retried(fake: FakeTpuServer) -> None:
    fake.api.faults.status_429 = 2  # HTTP 429 with ErrorInfo reason RATE_LIMIT_EXCEEDED
    result = tpu(fake, project="corporate-ml")
    assert not result.get("failed") and result["state"] == "READY", result


# ---- the create operation itself fails ------------------------------------------------------------
QUOTA_MESSAGE = f"Quota limit '{QUOTA}' has been exceeded. Limit: 0 in zone us-west4-a."


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"code": 8, "message": CAPACITY.format(zone="us-west4-a")}, "stockout"),
        (
            {
                "code": 8,
                "message": QUOTA_MESSAGE,
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [{"subject": "project:proj", "description": QUOTA_MESSAGE}],
                    }
                ],
            },
            "quota",
        ),
        ({"code": 13, "message": "Internal error while creating the node."}, "operation"),
    ],
)
def test_a_failed_create_operation_is_sorted_and_cleaned_up(
    fake: FakeTpuServer, error: dict[str, Any], kind: str
) -> None:
    fake.api.faults.create_op_error = {"us-west4-a": error}
    result = tpu(fake)
    assert result["zones_tried"][0] == {
        "zone": "us-west4-a",
        "result": kind,
        "reason": result["zones_tried"][0]["reason"],
    }
    if kind == "stockout":
        assert not result.get("failed") and result["zone"] == "us-east1-c", result
    else:
        assert result.get("failed") and result["error_kind"] == kind, result
        assert len(_creates(fake)) == 1
    assert ("us-west4-a", "tpu1") not in fake.api.queued  # the FAILED request was deleted
    assert "delete queued resource tpu1 in us-west4-a" in " ".join(result["actions"])


# ---- operations on their own version --------------------------------------------------------------
def test_operations_are_polled_on_the_version_that_made_them(fake: FakeTpuServer) -> None:
    result = tpu(fake)
    assert not result.get("failed"), result
    gone = tpu(fake, state="absent")
    assert not gone.get("failed"), gone
    polls = [r["path"] for r in fake.api.log if r["method"] == "GET" and "/operations/" in r["path"]]
    assert polls and all(p.startswith("/v2alpha1/") for p in polls), polls
    name = next(iter(fake.api.ops))  # the create's, made on v2alpha1: not served on v2
    assert _http(fake, "GET", f"/v2/{name}")[0] == 404
    assert _http(fake, "GET", f"/v2alpha1/{name}")[0] == 200


# ---- every documented state ------------------------------------------------------------------------
def test_every_state_of_the_installed_enums_is_sorted() -> None:
    api = module_util("tpu_api")
    assert {s.name for s in tpu_v2alpha1.QueuedResourceState.State} == api.QR_STATES
    assert {s.name for s in tpu_v2.Node.State} == api.NODE_STATES
    sets = [api.NODE_COMING, api.NODE_GONE, api.NODE_STUCK, {"READY"}]
    assert sum(len(s) for s in sets) == len(api.NODE_STATES)  # each state in exactly one set


def test_a_request_someone_is_deleting_is_waited_out_then_asked_again(fake: FakeTpuServer) -> None:
    assert not tpu(fake).get("failed")
    with fake.api.lock:
        fake.api.start_deleting("us-west4-a", "tpu1", 0.5)
    again = tpu(fake)
    assert not again.get("failed") and again["changed"] is True and again["state"] == "READY", again
    assert "DELETING" in again["recreated_because"]
    assert again["actions"][:2] == [
        "wait for queued resource tpu1 in us-west4-a (DELETING)",
        "create queued resource tpu1 in us-west4-a",
    ]
    assert not fake.api.requests("DELETE", "/queuedResources/")  # not deleted a second time


def test_absent_waits_out_a_delete_under_way(fake: FakeTpuServer) -> None:
    assert not tpu(fake).get("failed")
    with fake.api.lock:
        fake.api.start_deleting("us-west4-a", "tpu1", 0.5)
    gone = tpu(fake, state="absent")
    assert not gone.get("failed") and gone["left"] == [] and gone["still_costs"] == [], gone
    assert not fake.api.queued and not fake.api.nodes


@pytest.mark.parametrize("state", ["UNKNOWN", "STOPPED", "HIDDEN"])
def test_a_node_that_will_not_become_ready_fails_at_once(fake: FakeTpuServer, state: str) -> None:
    assert not tpu(fake).get("failed")
    with fake.api.lock:
        fake.api.set_node_state("us-west4-a", "tpu1", state)
    result = tpu(fake)
    assert result.get("failed") and result["error_kind"] == "operation", result
    assert f"node tpu1 in us-west4-a is {state}" in result["msg"] and "\n" not in result["msg"]


def test_a_node_on_its_way_back_is_waited_for(fake: FakeTpuServer) -> None:
    assert not tpu(fake).get("failed")
    with fake.api.lock:
        fake.api.set_node_state("us-west4-a", "tpu1", "REPAIRING")
    result = tpu(fake, operation_timeout=1)
    assert result.get("failed") and result["error_kind"] == "timeout", result  # waited, not refused
    assert "was REPAIRING, not READY" in result["msg"]


# ---- the fake answers only what the real types can hold ------------------------------------------
def test_a_misspelt_response_field_is_refused_by_the_fake(fake: FakeTpuServer) -> None:
    assert not tpu(fake).get("failed")
    path = "/v2alpha1/projects/proj/locations/us-west4-a"
    assert _http(fake, "GET", f"{path}/queuedResources/tpu1")[0] == 200
    with fake.api.lock:
        fake.api.queued[("us-west4-a", "tpu1")]["stat"] = {"state": "ACTIVE"}
    status, answer = _http(fake, "GET", f"{path}/queuedResources/tpu1")
    assert status == 500 and "stat" in answer["error"]["message"], answer
    with fake.api.lock:
        del fake.api.queued[("us-west4-a", "tpu1")]["stat"]
        fake.api.nodes[("us-west4-a", "tpu1")]["acceleratorTyp"] = "v5litepod-1"
    assert _http(fake, "GET", "/v2/projects/proj/locations/us-west4-a/nodes/tpu1")[0] == 500
    assert len(fake.api.strict_errors) == 2
    fake.api.strict_errors.clear()


def test_a_state_the_installed_types_do_not_have_is_refused_by_the_fake(fake: FakeTpuServer) -> None:
    """RESERVATION_BOUND is in no state enum of google-cloud-tpu 1.28.0: the fake cannot answer it."""
    assert not tpu(fake).get("failed")
    with fake.api.lock:
        fake.api.queued[("us-west4-a", "tpu1")]["state"] = {"state": "RESERVATION_BOUND"}
    status, _ = _http(fake, "GET", "/v2alpha1/projects/proj/locations/us-west4-a/queuedResources/tpu1")
    assert status == 500 and "RESERVATION_BOUND" in fake.api.strict_errors[0]
    fake.api.strict_errors.clear()
