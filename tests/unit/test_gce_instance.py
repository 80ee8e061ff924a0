"""gce_instance against the local fake Compute API, through the real google-cloud-compute client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ansible_run import module_docs
from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_compute.harness import run_module

ZONES = ["us-central1-a", "us-central1-b", "us-east1-c"]
BASE = {"project": "proj", "zones": ZONES, "name": "rig1"}


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults(op_delay=0.02)) as server:
        yield server


def _inserts(fake: FakeComputeServer) -> list[dict]:
    return [r for r in fake.api.requests("POST", "/instances")]


def _warnings(result: dict) -> str:
    return json.dumps(result.get("warnings", []))


def test_create_delete_idempotence(fake: FakeComputeServer) -> None:
    first = run_module(fake.endpoint, **BASE)
    assert first["changed"] is True, first
    assert first["zone"] == "us-central1-a" and first["status"] == "RUNNING"
    assert first["internal_ip"].startswith("10.") and first["external_ip"]
    assert {d["name"]: d["auto_delete"] for d in first["disks"]} == {"rig1": True, "rig1-data": False}
    assert first["actions"] == ["insert in us-central1-a"]

    again = run_module(fake.endpoint, **BASE)
    assert again["changed"] is False and not again.get("failed"), again
    assert len(_inserts(fake)) == 1

    gone = run_module(fake.endpoint, state="absent", **BASE)
    assert gone["changed"] is True and gone["status"] == "ABSENT"
    # The data disk survives the VM and is reported as still costing money.
    assert gone["data_disk"] == {
        "name": "rig1-data",
        "zone": "us-central1-a",
        "size_gb": 250,
        "type": "pd-balanced",
        "in_use": False,
    }
    assert ("us-central1-a", "rig1") not in fake.api.disks  # boot disk went with the VM

    gone_again = run_module(fake.endpoint, state="absent", **BASE)
    assert gone_again["changed"] is False and not gone_again.get("failed")


def test_instance_found_in_a_later_zone_is_not_recreated(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, **dict(BASE, zones=["us-east1-c"]))
    result = run_module(fake.endpoint, **BASE)
    assert result["changed"] is False and not result.get("failed") and result["zone"] == "us-east1-c"
    assert len(_inserts(fake)) == 1


def test_insert_body_is_a_t4_host(fake: FakeComputeServer) -> None:
    run_module(
        fake.endpoint, labels={"app": "gemma-rig"}, tags=["rig"], ssh_keys=["rig:ssh-ed25519 AAAA k"], **BASE
    )
    body = _inserts(fake)[0]["body"]
    assert body["machineType"].endswith("/machineTypes/n1-standard-2")
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": "projects/proj/zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 1,
        }
    ]
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
        "provisioningModel": "STANDARD",
    }
    boot, data = body["disks"]
    assert boot["boot"] is True and boot["autoDelete"] is True
    assert boot["initializeParams"]["sourceImage"] == "projects/debian-cloud/global/images/family/debian-13"
    assert boot["initializeParams"]["diskSizeGb"] == "32" and boot["initializeParams"]["diskType"].endswith(
        "pd-ssd"
    )
    assert data["autoDelete"] is False and data["initializeParams"]["diskSizeGb"] == "250"
    assert data["deviceName"] == "rig1-data"  # the rig mounts /dev/disk/by-id/google-rig1-data
    assert data["initializeParams"]["diskType"].endswith("pd-balanced")
    assert {"key": "ssh-keys", "value": "rig:ssh-ed25519 AAAA k"} in body["metadata"]["items"]
    assert body["labels"] == {"app": "gemma-rig"} and body["tags"]["items"] == ["rig"]
    assert _inserts(fake)[0]["query"]["requestId"]


def test_spot_settings_in_the_body(fake: FakeComputeServer) -> None:
    result = run_module(fake.endpoint, provisioning_model="spot", termination_action="delete", **BASE)
    assert result["changed"] is True
    assert _inserts(fake)[0]["body"]["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
    }


def test_stockout_in_first_zone_lands_in_second(fake: FakeComputeServer) -> None:
    fake.api.faults.stockout_zones = {"us-central1-a"}
    result = run_module(fake.endpoint, **BASE)
    assert result["changed"] is True and result["zone"] == "us-central1-b"
    assert [(z["zone"], z["result"]) for z in result["zones_tried"]] == [
        ("us-central1-a", "stockout"),
        ("us-central1-b", "created"),
    ]
    assert result["zones_tried"][0]["reason"].startswith("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: ")
    assert "us-central1-a has no capacity" in _warnings(result)
    assert ("us-central1-a", "rig1-data") not in fake.api.disks  # nothing left behind in the full zone


def test_stockout_everywhere_fails_naming_the_zones(fake: FakeComputeServer) -> None:
    fake.api.faults.stockout_zones = set(ZONES)
    result = run_module(fake.endpoint, **BASE)
    assert result["failed"] is True and result["error_kind"] == "stockout"
    assert all(zone in result["msg"] for zone in ZONES)


def test_sync_quota_error_fails_at_once_with_its_name(fake: FakeComputeServer) -> None:
    fake.api.faults.quota_sync = "NVIDIA_T4_GPUS"
    result = run_module(fake.endpoint, **BASE)
    assert result["failed"] is True and result["quota"] == "NVIDIA_T4_GPUS"
    assert "NVIDIA_T4_GPUS" in result["msg"] and "Quotas" in result["msg"]
    assert len(_inserts(fake)) == 1  # no other zone tried, no retry


def test_operation_quota_error_names_the_spot_quota(fake: FakeComputeServer) -> None:
    fake.api.faults.quota_operation = "PREEMPTIBLE_NVIDIA_T4_GPUS"
    result = run_module(fake.endpoint, provisioning_model="spot", **BASE)
    assert result["failed"] is True and result["quota"] == "PREEMPTIBLE_NVIDIA_T4_GPUS"
    assert result["error_code"] == "QUOTA_EXCEEDED"
    assert len(_inserts(fake)) == 1


def test_two_503s_then_success(fake: FakeComputeServer) -> None:
    fake.api.faults.insert_503 = 2
    result = run_module(fake.endpoint, **BASE)
    assert result["changed"] is True and result["zone"] == "us-central1-a"
    inserts = _inserts(fake)
    assert len(inserts) == 3
    assert len({r["query"]["requestId"] for r in inserts}) == 1  # the retry is the same request


def test_lost_insert_reply_is_not_a_second_vm(fake: FakeComputeServer) -> None:
    fake.api.faults.insert_503_after = 1  # the insert happened, its answer was a 503
    result = run_module(fake.endpoint, **BASE)
    assert result["changed"] is True and result["status"] == "RUNNING"
    assert len(_inserts(fake)) == 2 and len(fake.api.instances) == 1


def test_429_is_retried(fake: FakeComputeServer) -> None:
    fake.api.faults.status_429 = 3
    result = run_module(fake.endpoint, **BASE)
    assert result["changed"] is True, result
    assert fake.api.faults.status_429 == 0


def test_failed_operation_fails_with_its_own_error(fake: FakeComputeServer) -> None:
    fake.api.faults.operation_error = {
        "code": "RESOURCE_NOT_FOUND",
        "message": "The resource 'image' was not found",
    }
    result = run_module(fake.endpoint, **BASE)
    assert result["failed"] is True and result["error_kind"] == "operation"
    assert "RESOURCE_NOT_FOUND: The resource 'image' was not found" in result["msg"]
    assert len(_inserts(fake)) == 1  # not a stockout: no other zone tried


def test_existing_data_disk_is_reused_in_its_zone(fake: FakeComputeServer) -> None:
    fake.api.add_disk("proj", "us-central1-b", "rig1-data")
    result = run_module(fake.endpoint, **BASE)
    assert result["zone"] == "us-central1-b"
    data = _inserts(fake)[0]["body"]["disks"][1]
    assert data["source"] == "projects/proj/zones/us-central1-b/disks/rig1-data"
    assert "initializeParams" not in data and data["autoDelete"] is False
    assert "reuse data disk rig1-data in us-central1-b" in result["actions"]
    assert "exists in us-central1-b" in _warnings(result)


def test_teardown_can_delete_the_data_disk(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, **BASE)
    result = run_module(fake.endpoint, state="absent", delete_data_disk=True, **BASE)
    assert result["changed"] is True and result["data_disk"] is None
    assert fake.api.disks == {}


def test_check_mode_sends_no_state_changing_request(fake: FakeComputeServer) -> None:
    planned = run_module(fake.endpoint, check=True, diff=True, **BASE)
    assert planned["changed"] is True and planned["status"] == "PLANNED"
    assert planned["diff"]["after"]["machine_type"] == "n1-standard-2"
    assert fake.api.mutating_requests() == []

    run_module(fake.endpoint, **BASE)
    before = len(fake.api.mutating_requests())
    for params in (
        {"labels": {"a": "b"}},
        {"machine_type": "n1-standard-4", "allow_stop": True},
        {"state": "stopped"},
        {"state": "absent", "delete_data_disk": True},
    ):
        result = run_module(fake.endpoint, check=True, **dict(BASE, **params))
        assert result["changed"] is True, (params, result)
    assert len(fake.api.mutating_requests()) == before


def test_in_place_change_and_diff(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, labels={"app": "rig"}, **BASE)
    result = run_module(fake.endpoint, diff=True, labels={"app": "rig", "owner": "me"}, **BASE)
    assert result["changed"] is True and result["changes"]["in_place"] == ["labels"]
    assert result["diff"]["before"]["labels"] == {"app": "rig"}
    assert result["diff"]["after"]["labels"] == {"app": "rig", "owner": "me"}
    assert fake.api.requests("POST", "/setLabels") and not fake.api.requests("POST", "/stop")
    again = run_module(fake.endpoint, labels={"app": "rig", "owner": "me"}, **BASE)
    assert again["changed"] is False and not again.get("failed")


def test_change_needing_stop_fails_unless_allowed(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, **BASE)
    refused = run_module(fake.endpoint, diff=True, machine_type="n1-standard-4", **BASE)
    assert refused["failed"] is True and "machine_type" in refused["msg"] and "allow_stop" in refused["msg"]
    assert refused["diff"]["after"]["machine_type"] == "n1-standard-4"
    assert not fake.api.requests("POST", "/stop")

    done = run_module(fake.endpoint, machine_type="n1-standard-4", allow_stop=True, **BASE)
    assert done["changed"] is True and done["status"] == "RUNNING"
    assert done["actions"] == [
        "stop in us-central1-a",
        "set_machine_type in us-central1-a",
        "start in us-central1-a",
    ]
    assert fake.api.instances[("us-central1-a", "rig1")]["machineType"].endswith("/n1-standard-4")


def test_change_needing_a_new_vm_fails(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, **BASE)
    result = run_module(fake.endpoint, external_ip=False, allow_stop=True, **BASE)
    assert result["failed"] is True and "external_ip" in result["msg"]
    assert [r["method"] for r in fake.api.mutating_requests()] == ["POST"]  # the first insert only


def test_stop_and_start_states(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, **BASE)
    stopped = run_module(fake.endpoint, state="stopped", **BASE)
    assert stopped["changed"] is True and stopped["status"] == "TERMINATED"
    again = run_module(fake.endpoint, state="stopped", **BASE)
    assert again["changed"] is False and not again.get("failed")
    started = run_module(fake.endpoint, state="started", **BASE)
    assert started["changed"] is True and started["status"] == "RUNNING"


def test_ansible_doc_renders() -> None:
    doc = module_docs("gce_instance")["gce_instance"]
    assert {"zones", "api_endpoint", "allow_stop", "provisioning_model"} <= set(doc["doc"]["options"])
    assert "zones_tried" in doc["return"] and "gce_instance:" in doc["examples"]


def test_custom_data_disk_name_keeps_the_device_name(fake: FakeComputeServer) -> None:
    fake.api.add_disk("proj", "us-central1-a", "models-disk")
    result = run_module(fake.endpoint, data_disk={"name": "models-disk"}, **BASE)
    data = _inserts(fake)[0]["body"]["disks"][1]
    assert data["source"].endswith("/disks/models-disk") and data["deviceName"] == "rig1-data"
    assert result["data_disk"]["name"] == "models-disk" and result["data_disk"]["in_use"] is True


def test_missing_credentials_fail_clearly(
    fake: FakeComputeServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No ADC anywhere: an empty home, no key variable, and no metadata server to ask.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # google-auth's switch to skip the metadata server
    result = run_module(fake.endpoint, **dict(BASE, auth_kind="application"))
    assert result["failed"] is True and result["error_kind"] == "auth"
    assert "application-default login" in result["msg"]
    assert fake.api.log == []
