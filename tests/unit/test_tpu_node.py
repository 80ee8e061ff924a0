"""tpu_node against the local fake Cloud TPU API, through google-cloud-tpu and the same credentials."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.fake_compute.harness import run_module
from tests.fake_tpu import FakeTpuServer, Faults

ZONES = ["us-west4-a", "us-east1-c"]
BASE = {"project": "proj", "zones": ZONES, "name": "tpu1"}
QUOTA = "TPUV5sLitepodPerProjectPerZoneForTPUAPI"
QUOTA_PREEMPTIBLE = "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"


@pytest.fixture
def fake() -> Iterator[FakeTpuServer]:
    with FakeTpuServer(Faults(op_delay=0.02, provision_delay=0.1)) as server:
        yield server
        assert server.api.strict_errors == []  # every answer parsed as the real type (strict.py)


def tpu(fake: FakeTpuServer, **params: Any) -> dict[str, Any]:
    run = partial(run_module, fake.endpoint, module="tpu_node")
    return run(**dict(BASE, **params))


def _creates(fake: FakeTpuServer) -> list[dict[str, Any]]:
    return fake.api.requests("POST", "/queuedResources")


def _ok(result: dict[str, Any]) -> bool:
    return not result.get("failed")


# ---- the fake refuses what the API refuses ------------------------------------------------------
def _post(fake: FakeTpuServer, zone: str, qr_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    url = f"{fake.endpoint}/v2alpha1/projects/proj/locations/{zone}/queuedResources?queuedResourceId={qr_id}"
    request = urllib.request.Request(
        url, json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _spec(zone: str = "us-west4-a", **node: Any) -> dict[str, Any]:
    node = dict({"acceleratorType": "v5litepod-1", "runtimeVersion": "v2-alpha-tpuv5-lite"}, **node)
    return {
        "tpu": {"nodeSpec": [{"parent": f"projects/proj/locations/{zone}", "nodeId": "n1", "node": node}]}
    }


@pytest.mark.parametrize(
    ("zone", "qr_id", "body", "says"),
    [
        ("us-west4-a", "n1", dict(_spec(), colour="blue"), "Invalid JSON payload"),
        ("us-west4-a", "N_1", _spec(), "queuedResourceId"),
        ("us-west4-a", "n1", _spec(zone="us-east1-c"), "must be the request's parent"),
        ("us-west4-a", "n1", _spec(acceleratorType="v9-1"), "could not be found in the zonal accelerator"),
        ("us-west4-a", "n1", dict(_spec(), spot={}, guaranteed={}), 'multiple "tier" oneof'),
        (
            "us-west4-a",
            "n1",
            dict(_spec(), runDuration={"maxRunDuration": "60s"}),
            "only valid with the FLEX_START",
        ),
        (
            "us-west4-a",
            "n1",
            dict(_spec(), provisioningModel="FLEX_START", runDuration={"maxRunDuration": "700000s"}),
            "at most 7 days",
        ),
        (
            "europe-west4-a",
            "n1",
            dict(
                _spec("europe-west4-a"), provisioningModel="FLEX_START", runDuration={"maxRunDuration": "60s"}
            ),
            "FLEX_START provisioning model is not supported for accelerator type v5litepod-1",
        ),
        ("mars-north1-a", "n1", _spec("mars-north1-a"), "Invalid location"),
    ],
)
def test_fake_refuses_bad_requests(fake: FakeTpuServer, zone: str, qr_id: str, body: dict, says: str) -> None:
    status, answer = _post(fake, zone, qr_id, body)
    assert status == 400 and answer["error"]["status"] == "INVALID_ARGUMENT", answer
    assert says in answer["error"]["message"]


def test_fake_fills_in_the_node_and_quota_errors_are_googles_shape(fake: FakeTpuServer) -> None:
    status, op = _post(fake, "us-west4-a", "n1", _spec(networkConfig={"enableExternalIps": True}))
    assert status == 200 and op["name"].startswith("projects/proj/locations/us-west4-a/operations/")
    assert op["done"] is False and op["metadata"]["verb"] == "create"
    with fake.api.lock:
        fake.api.faults.op_delay = fake.api.faults.provision_delay = 0
        fake.api._timeline[("us-west4-a", "n1")].update(created=0, decided=0)
        node = fake.api.get_node("us-west4-a", "n1")
    assert node["state"] == "READY" and node["health"] == "HEALTHY" and node["id"]
    assert node["networkEndpoints"][0]["accessConfig"]["externalIp"]
    assert node["networkConfig"]["subnetwork"] == "projects/proj/regions/us-west4/subnetworks/default"
    assert node["serviceAccount"]["email"].endswith("-compute@developer.gserviceaccount.com")
    fake.api.faults.quota_zero = {QUOTA}
    status, answer = _post(fake, "us-west4-a", "n2", _spec())
    assert status == 429 and answer["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert QUOTA in answer["error"]["message"]
    assert answer["error"]["details"][0]["@type"] == "type.googleapis.com/google.rpc.QuotaFailure"


# ---- the module ---------------------------------------------------------------------------------
def test_create_then_converge_again_changes_nothing(fake: FakeTpuServer) -> None:
    first = tpu(fake, ssh_keys=["rig:ssh-ed25519 AAAA k"], labels={"app": "gemma-rig"})
    assert _ok(first) and first["changed"] is True, first
    assert first["zone"] == "us-west4-a" and first["state"] == "READY"
    assert first["queued_resource_state"] == "ACTIVE" and first["external_ip"].startswith("34.")
    assert first["accelerator_type"] == "v5litepod-1" and first["runtime_version"] == "v2-alpha-tpuv5-lite"
    (create,) = _creates(fake)
    assert create["path"] == "/v2alpha1/projects/proj/locations/us-west4-a/queuedResources"
    assert create["query"]["queuedResourceId"] == "tpu1" and create["query"]["requestId"]
    node = create["body"]["tpu"]["nodeSpec"][0]["node"]
    assert node["metadata"]["ssh-keys"] == "rig:ssh-ed25519 AAAA k" and node["labels"] == {"app": "gemma-rig"}
    assert "spot" not in create["body"] and "provisioningModel" not in create["body"]  # on-demand

    again = tpu(fake, ssh_keys=["rig:ssh-ed25519 AAAA k"], labels={"app": "gemma-rig"})
    assert _ok(again) and again["changed"] is False, again
    assert again["external_ip"] == first["external_ip"] and len(_creates(fake)) == 1


def test_spot_and_flex_start_bodies(fake: FakeTpuServer) -> None:
    spot = tpu(fake, provisioning_model="spot")
    assert _ok(spot) and spot["provisioning_model"] == "spot"
    assert _creates(fake)[0]["body"]["spot"] == {}
    flex = tpu(fake, name="tpu2", provisioning_model="flex-start", max_run_duration="4h")
    assert _ok(flex) and flex["provisioning_model"] == "flex-start", flex
    body = _creates(fake)[1]["body"]
    assert body["provisioningModel"] == "FLEX_START" and body["runDuration"] == {"maxRunDuration": "14400s"}
    # zone_wait 5 + operation_timeout 20 + 60 s: the request outlives every wait of the module
    assert body["queueingPolicy"] == {"validUntilDuration": "85s"}


def test_stockout_in_the_first_zone_lands_in_the_next(fake: FakeTpuServer) -> None:
    fake.api.faults.stockout_zones = {"us-west4-a"}
    result = tpu(fake)
    assert _ok(result) and result["changed"] is True and result["zone"] == "us-east1-c", result
    assert [(z["zone"], z["result"]) for z in result["zones_tried"]] == [
        ("us-west4-a", "stockout"),
        ("us-east1-c", "created"),
    ]
    assert "no more capacity" in result["zones_tried"][0]["reason"]
    assert "us-west4-a has no capacity" in json.dumps(result["warnings"])
    assert ("us-west4-a", "tpu1") not in fake.api.queued  # the failed request was deleted


def test_flex_start_refused_in_a_zone_tries_the_next(fake: FakeTpuServer) -> None:
    result = tpu(fake, zones=["europe-west4-a", "us-west4-a"], provisioning_model="flex-start")
    assert _ok(result) and result["zone"] == "us-west4-a", result
    assert result["zones_tried"][0]["result"] == "unsupported"


def test_waiting_too_long_counts_as_no_capacity(fake: FakeTpuServer) -> None:
    fake.api.faults.waiting_zones = {"us-west4-a"}
    result = tpu(fake, zone_wait=1)
    assert _ok(result) and result["zone"] == "us-east1-c", result
    assert "WAITING_FOR_RESOURCES" in result["zones_tried"][0]["reason"]


@pytest.mark.parametrize(
    ("model", "quota"), [("on-demand", QUOTA), ("flex-start", QUOTA_PREEMPTIBLE), ("spot", QUOTA_PREEMPTIBLE)]
)
@pytest.mark.parametrize("at_create", [True, False])
def test_quota_fails_at_once_naming_it(fake: FakeTpuServer, model: str, quota: str, at_create: bool) -> None:
    fake.api.faults.quota_zero = {quota}
    fake.api.faults.quota_at_create = at_create
    result = tpu(fake, provisioning_model=model)
    assert result["failed"] is True and result["error_kind"] == "quota" and result["quota"] == quota, result
    assert "\n" not in result["msg"] and f"quota {quota} is exhausted in us-west4-a" in result["msg"]
    assert len(_creates(fake)) == 1  # no other zone: quota is not a zone's capacity
    assert not fake.api.queued and not fake.api.nodes  # a FAILED request is not left behind


def test_throttling_is_retried_but_not_quota(fake: FakeTpuServer) -> None:
    fake.api.faults.status_429 = 2
    result = tpu(fake)
    assert _ok(result) and result["state"] == "READY", result


def test_flex_start_runs_out_then_converge_recreates(fake: FakeTpuServer) -> None:
    first = tpu(fake, provisioning_model="flex-start")
    assert _ok(first) and first["changed"] is True
    with fake.api.lock:
        fake.api.run_out("us-west4-a", "tpu1")
    again = tpu(fake, provisioning_model="flex-start")
    assert _ok(again) and again["changed"] is True and again["state"] == "READY", again
    assert (
        "SUSPENDED" in again["recreated_because"]
        and "flex-start ran its max_run_duration" in again["recreated_because"]
    )
    assert again["actions"][:2] == [
        "delete queued resource tpu1 in us-west4-a",
        "create queued resource tpu1 in us-west4-a",
    ]
    assert len(_creates(fake)) == 2
    settled = tpu(fake, provisioning_model="flex-start")
    assert _ok(settled) and settled["changed"] is False


def test_preempted_spot_node_is_recreated(fake: FakeTpuServer) -> None:
    tpu(fake, provisioning_model="spot")
    with fake.api.lock:
        fake.api.preempt("us-west4-a", "tpu1")
    again = tpu(fake, provisioning_model="spot")
    assert _ok(again) and again["changed"] is True and "PREEMPTED" in again["recreated_because"], again


def test_a_different_model_fails_naming_it(fake: FakeTpuServer) -> None:
    tpu(fake)
    result = tpu(fake, provisioning_model="spot")
    assert result["failed"] is True and result["error_kind"] == "differs"
    assert "provisioning_model is on-demand, asked spot" in result["msg"]


def test_teardown_reports_what_still_costs(fake: FakeTpuServer) -> None:
    tpu(fake)
    gone = tpu(fake, state="absent")
    assert _ok(gone) and gone["changed"] is True, gone
    assert gone["state"] == "ABSENT" and gone["still_costs"] == [] and gone["left"] == []
    assert gone["actions"] == ["delete queued resource tpu1 in us-west4-a"]
    assert not fake.api.queued and not fake.api.nodes
    again = tpu(fake, state="absent")
    assert _ok(again) and again["changed"] is False


def test_check_mode_sends_no_change_and_predicts(fake: FakeTpuServer) -> None:
    plan = tpu(fake, check=True, provisioning_model="flex-start")
    assert _ok(plan) and plan["changed"] is True and plan["state"] == "PLANNED", plan
    assert plan["body"]["provisioningModel"] == "FLEX_START" and plan["zone"] == "us-west4-a"
    assert not _creates(fake) and not fake.api.queued
    tpu(fake, provisioning_model="flex-start")
    with fake.api.lock:
        fake.api.run_out("us-west4-a", "tpu1")
    plan = tpu(fake, check=True, provisioning_model="flex-start")
    assert plan["changed"] is True and "SUSPENDED" in plan["recreated_because"]
    assert fake.api.queued[("us-west4-a", "tpu1")]["state"]["state"] == "SUSPENDED"  # untouched
    plan = tpu(fake, check=True, state="absent")
    assert plan["changed"] is True and ("us-west4-a", "tpu1") in fake.api.queued
    assert [r["method"] for r in fake.api.log if r["method"] != "GET"] == ["POST"]


def test_diff_mode_shows_before_and_after(fake: FakeTpuServer) -> None:
    created = tpu(fake, diff=True)
    assert created["diff"]["before"] == {}
    assert created["diff"]["after"] == {
        "zone": "us-west4-a",
        "accelerator_type": "v5litepod-1",
        "runtime_version": "v2-alpha-tpuv5-lite",
        "provisioning_model": "on-demand",
        "state": "READY",
    }
    same = tpu(fake, diff=True)
    assert same["diff"]["before"] == same["diff"]["after"]
    gone = tpu(fake, diff=True, state="absent")
    assert gone["diff"]["before"]["state"] == "READY" and gone["diff"]["after"] == {}


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"provisioning_model": "flex-start", "max_run_duration": "8d"}, "at most 7 days"),
        ({"provisioning_model": "flex-start", "max_run_duration": "soon"}, "not a duration"),
        ({"zones": []}, "at least one zone"),
        ({"zone_wait": 0}, "zone_wait must be above 0"),
    ],
)
def test_bad_parameters_fail_before_any_request(fake: FakeTpuServer, params: dict, says: str) -> None:
    result = tpu(fake, **params)
    assert result["failed"] is True and says in result["msg"] and not fake.api.log


# ---- the TPU VM's identity: its service account and its SSH host keys -----------------------------
def test_the_tpu_vm_gets_no_cloud_api_unless_an_account_is_named(fake: FakeTpuServer) -> None:
    """The API has no "no service account": left out, the VM gets the default account with every
    Cloud API (an empty scope list). The module always sends the scopes, by default only userinfo.email."""
    result = tpu(fake, zones=["us-west4-a"])
    assert _ok(result), result
    (create,) = _creates(fake)
    node = create["body"]["tpu"]["nodeSpec"][0]["node"]
    assert node["serviceAccount"] == {"scope": ["https://www.googleapis.com/auth/userinfo.email"]}
    made = fake.api.nodes[("us-west4-a", "tpu1")]["serviceAccount"]
    assert made["scope"] == ["https://www.googleapis.com/auth/userinfo.email"]


def test_a_named_service_account_and_its_scopes_are_sent(fake: FakeTpuServer) -> None:
    email = "rig-tpu@proj.iam.gserviceaccount.com"
    scopes = ["https://www.googleapis.com/auth/devstorage.read_only"]
    result = tpu(fake, zones=["us-west4-a"], service_account=email, service_account_scopes=scopes)
    assert _ok(result), result
    node = _creates(fake)[0]["body"]["tpu"]["nodeSpec"][0]["node"]
    assert node["serviceAccount"] == {"email": email, "scope": scopes}
    assert fake.api.nodes[("us-west4-a", "tpu1")]["serviceAccount"] == {"email": email, "scope": scopes}


def test_an_empty_scope_list_is_refused_before_any_request(fake: FakeTpuServer) -> None:
    result = tpu(fake, service_account_scopes=[])
    assert result["failed"] and result["error_kind"] == "invalid" and "every Cloud API" in result["msg"]
    assert fake.api.log == []


def test_the_tpu_vms_host_keys_are_pinned_and_a_change_fails(fake: FakeTpuServer, tmp_path: Path) -> None:
    from tests.fake_compute.state import new_host_keys

    known_hosts = tmp_path / "known_hosts"
    result = tpu(fake, zones=["us-west4-a"], known_hosts=str(known_hosts))
    assert _ok(result), result
    node = _creates(fake)[0]["body"]["tpu"]["nodeSpec"][0]["node"]
    assert node["metadata"]["enable-guest-attributes"] == "TRUE"
    alias = f"tpu/proj/us-west4-a/tpu1/{result['id']}"
    published = fake.api.host_keys[result["id"]]
    assert sorted(known_hosts.read_text().splitlines()) == sorted(
        f"{alias} {k} {v}" for k, v in published.items()
    )
    assert "-o StrictHostKeyChecking=yes" in result["ssh_common_args"]
    assert f"UserKnownHostsFile={known_hosts}" in result["ssh_common_args"]
    assert f"HostKeyAlias={alias}" in result["ssh_common_args"]
    (query,) = fake.api.requests("POST", ":getGuestAttributes")
    assert query["body"] == {"queryPath": "hostkeys/", "workerIds": ["0"]}

    again = tpu(fake, zones=["us-west4-a"], known_hosts=str(known_hosts))
    assert again["changed"] is False and again["actions"] == [], again

    published["ssh-ed25519"] = new_host_keys()["ssh-ed25519"]
    changed = tpu(fake, zones=["us-west4-a"], known_hosts=str(known_hosts))
    assert changed["failed"] and changed["error_kind"] == "hostkeys", changed
    assert changed["msg"].startswith(f"TPU VM tpu1 (project proj, zone us-west4-a, id {result['id']})")
    assert "\n" not in changed["msg"] and alias in changed["msg"]


def test_a_tpu_vm_that_publishes_no_keys_times_out(tmp_path: Path) -> None:
    with FakeTpuServer(Faults(op_delay=0.02, provision_delay=0.1, hostkeys_delay=3600)) as server:
        result = run_module(
            server.endpoint, module="tpu_node", **dict(BASE, zones=["us-west4-a"]),
            known_hosts=str(tmp_path / "known_hosts"), host_keys_timeout=1,
        )  # fmt: skip
    assert result["failed"] and result["error_kind"] == "timeout", result
    assert "TPU VM tpu1" in result["msg"] and "published no SSH host keys" in result["msg"]
    assert not (tmp_path / "known_hosts").exists()
