"""gce_instance against a fake that fills in and refuses what the real Compute API does.

The first group checks the fake itself against the API reference (so the module's tests mean
something); the rest check the module: idempotence in the google.cloud style, what others add
to a VM, failures midway, numbers refused before any request, and the retry paths.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fake_compute import FakeComputeServer, Faults
from tests.fake_compute.harness import run_module

ZONES = ["us-central1-a", "us-central1-b"]
BASE = {"project": "proj", "zones": ZONES, "name": "rig1"}
URL = "https://www.googleapis.com/compute/v1/projects/proj"


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults(op_delay=0.02, wait_max=0.5)) as server:
        yield server


def _post(fake: FakeComputeServer, path: str, body: dict[str, Any], request_id: str | None = None) -> Any:
    """A raw REST call, as a client other than google-cloud-compute would make it."""
    query = f"?requestId={request_id}" if request_id else ""
    request = urllib.request.Request(
        f"{fake.endpoint}/compute/v1/projects/proj/{path}{query}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _minimal(name: str = "vm1", **extra: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "machineType": "zones/us-central1-a/machineTypes/n1-standard-2",
        "disks": [
            {
                "boot": True,
                "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-13"},
            }
        ],
        "networkInterfaces": [{"network": "global/networks/default"}],
    }
    body.update(extra)
    return body


def _unchanged(result: dict[str, Any]) -> bool:
    """Succeeded and changed nothing (a failed run also says changed=false)."""
    return result["changed"] is False and not result.get("failed")


# ---- the fake fills in what the API fills in, and refuses what it refuses ------------------------
def test_fake_fills_in_server_side_fields_nobody_sent(fake: FakeComputeServer) -> None:
    status, op = _post(fake, "zones/us-central1-a/instances", _minimal(), str(uuid.uuid4()))
    assert status == 200 and op["kind"] == "compute#operation" and op["clientOperationId"]
    fake.api.wait_operation(op["name"])
    inst = fake.api.get_instance("us-central1-a", "vm1")
    nic = inst["networkInterfaces"][0]
    assert nic["subnetwork"] == f"{URL}/regions/us-central1/subnetworks/default"  # never sent
    assert nic["network"] == f"{URL}/global/networks/default"
    assert nic["networkIP"].startswith("10.") and nic["name"] == "nic0" and nic["fingerprint"]
    assert nic["kind"] == "compute#networkInterface" and nic["stackType"] == "IPV4_ONLY"
    assert "accessConfigs" not in nic  # none asked for: no external IP
    (disk,) = inst["disks"]
    assert disk["source"] == f"{URL}/zones/us-central1-a/disks/vm1"  # diskName defaults to the VM's
    assert disk["deviceName"] == "persistent-disk-0" and disk["index"] == 0
    assert (disk["type"], disk["mode"], disk["interface"]) == ("PERSISTENT", "READ_WRITE", "SCSI")
    assert disk["autoDelete"] is False  # the API's default: the module must say true for the boot disk
    assert disk["licenses"][0].endswith("/projects/debian-cloud/global/licenses/debian-13-trixie")
    assert disk["diskSizeGb"] == "10"  # the image's size when none is asked
    assert inst["scheduling"] == {
        "onHostMaintenance": "MIGRATE",
        "automaticRestart": True,
        "preemptible": False,
        "provisioningModel": "STANDARD",
    }
    assert inst["status"] == "RUNNING" and inst["cpuPlatform"] and inst["kind"] == "compute#instance"
    assert inst["selfLink"] == f"{URL}/zones/us-central1-a/instances/vm1"
    assert inst["id"].isdigit() and inst["creationTimestamp"] and inst["lastStartTimestamp"]
    assert inst["labelFingerprint"] and inst["metadata"]["fingerprint"] and inst["tags"]["fingerprint"]
    assert "labels" not in inst and "items" not in inst["metadata"] and "serviceAccounts" not in inst
    assert (
        fake.api.get_disk("us-central1-a", "vm1")["type"]
        == f"{URL}/zones/us-central1-a/diskTypes/pd-standard"
    )


def test_fake_stores_the_default_service_account_by_its_email(fake: FakeComputeServer) -> None:
    body = _minimal(
        serviceAccounts=[{"email": "default", "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    )
    _post(fake, "zones/us-central1-a/instances", body)
    email = fake.api.instances[("us-central1-a", "vm1")]["serviceAccounts"][0]["email"]
    assert email.endswith("-compute@developer.gserviceaccount.com")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"bogus": 1}, 'Unknown name "bogus"'),
        ({"networkInterfaces": [{"subnet": "default"}]}, 'Unknown name "subnet"'),
        ({"scheduling": {"onHostMaintenance": "SOMETIMES"}}, "scheduling.onHostMaintenance"),
        ({"name": "Rig_1"}, "resource.name"),
        ({"machineType": "zones/us-central1-a/machineTypes/n1-standard-3"}, "does not exist"),
        (
            {"guestAccelerators": [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]},
            "do not support live migration",
        ),
        (
            {
                "scheduling": {"onHostMaintenance": "TERMINATE"},
                "guestAccelerators": [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 3}],
            },
            "counts of 1, 2, 4",
        ),
        ({"scheduling": {"provisioningModel": "SPOT", "automaticRestart": True}}, "automatically restarted"),
    ],
)
def test_fake_refuses_what_the_api_refuses(fake: FakeComputeServer, change: dict, words: str) -> None:
    status, answer = _post(fake, "zones/us-central1-a/instances", _minimal(**change))
    assert status in (400, 404) and words in answer["error"]["message"], answer
    assert fake.api.instances == {}


def test_fake_refuses_a_request_id_that_is_not_a_uuid(fake: FakeComputeServer) -> None:
    status, answer = _post(fake, "zones/us-central1-a/instances", _minimal(), "retry-1")
    assert status == 400 and "requestId" in answer["error"]["message"]


def test_fake_answers_a_repeated_request_id_with_the_first_operation(fake: FakeComputeServer) -> None:
    request_id = str(uuid.uuid4())
    _, first = _post(fake, "zones/us-central1-a/instances", _minimal(), request_id)
    _, again = _post(fake, "zones/us-central1-a/instances", _minimal(), request_id)
    assert again["name"] == first["name"] and len(fake.api.instances) == 1


# ---- idempotence, google.cloud style -------------------------------------------------------------
@pytest.mark.parametrize(
    "options",
    [
        {},  # subnetwork, service_account, tags, labels, metadata all unset
        {
            "subnetwork": "default",
            "service_account": "default",
            "tags": ["rig"],
            "labels": {"app": "rig", "v": 2},
        },
        {"accelerator_count": 0, "provisioning_model": "spot", "ssh_keys": ["rig:ssh-ed25519 AAAA k"]},
    ],
    ids=["unset", "set", "no-gpu-spot"],
)
def test_create_create_delete_delete(fake: FakeComputeServer, options: dict) -> None:
    params = dict(BASE, **options)
    created = run_module(fake.endpoint, **params)
    assert created["changed"] is True and created["status"] == "RUNNING", created
    after_create = len(fake.api.mutating_requests())

    again = run_module(fake.endpoint, diff=True, **params)
    assert _unchanged(again), again
    assert again["changes"] == {"in_place": [], "stop": [], "recreate": []}
    assert again["diff"]["before"] == {k: v for k, v in again["diff"]["after"].items()}
    assert len(fake.api.mutating_requests()) == after_create  # reads only

    checked = run_module(fake.endpoint, check=True, **params)
    assert _unchanged(checked)

    gone = run_module(fake.endpoint, state="absent", **params)
    assert gone["changed"] is True and gone["status"] == "ABSENT"
    assert _unchanged(run_module(fake.endpoint, state="absent", **params))
    assert fake.api.instances == {}


def test_what_others_add_to_the_vm_is_not_a_difference(fake: FakeComputeServer) -> None:
    params = dict(
        BASE, labels={"app": "rig"}, ssh_keys=["rig:ssh-ed25519 AAAA rig"], startup_script="echo hi"
    )
    run_module(fake.endpoint, **params)
    live = fake.api.instances[("us-central1-a", "rig1")]
    # What the console, gcloud compute ssh and Google's agents add to a running VM:
    live["labels"]["goog-ops-agent-policy"] = "v2-x86-template-1-4-0"
    items = live["metadata"]["items"]
    next(i for i in items if i["key"] == "ssh-keys")["value"] += "\nalice:ssh-rsa BBBB google-ssh {}"
    items.append({"key": "enable-guest-attributes", "value": "TRUE"})
    before = len(fake.api.mutating_requests())

    assert _unchanged(run_module(fake.endpoint, **params))
    assert len(fake.api.mutating_requests()) == before

    # A label the caller does ask for is set, and what others added stays.
    result = run_module(fake.endpoint, **dict(params, labels={"app": "rig", "owner": "me"}))
    assert result["changed"] is True and result["changes"]["in_place"] == ["labels"]
    labels = fake.api.instances[("us-central1-a", "rig1")]["labels"]
    assert labels == {"app": "rig", "owner": "me", "goog-ops-agent-policy": "v2-x86-template-1-4-0"}

    # A new key of ours is appended to ssh-keys; the console's key stays.
    run_module(
        fake.endpoint, **dict(params, ssh_keys=["rig:ssh-ed25519 AAAA rig", "ops:ssh-ed25519 CCCC ops"])
    )
    meta = {i["key"]: i["value"] for i in fake.api.instances[("us-central1-a", "rig1")]["metadata"]["items"]}
    assert meta["ssh-keys"].splitlines() == [
        "rig:ssh-ed25519 AAAA rig",
        "alice:ssh-rsa BBBB google-ssh {}",
        "ops:ssh-ed25519 CCCC ops",
    ]
    assert meta["enable-guest-attributes"] == "TRUE" and meta["startup-script"] == "echo hi"


def test_a_reply_that_leaves_scheduling_defaults_out_is_not_a_difference(fake: FakeComputeServer) -> None:
    """Another API implementation may omit fields at their documented defaults (automatic restart
    on, STANDARD provisioning): those are what the caller asked for, not a difference."""
    run_module(fake.endpoint, **BASE)
    fake.api.instances[("us-central1-a", "rig1")]["scheduling"] = {"onHostMaintenance": "TERMINATE"}
    result = run_module(fake.endpoint, **BASE)
    assert _unchanged(result), result
    spot = dict(BASE, name="rig2", provisioning_model="spot")
    run_module(fake.endpoint, **spot)
    fake.api.instances[("us-central1-a", "rig2")]["scheduling"] = {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP",
    }
    result = run_module(fake.endpoint, **spot)
    assert _unchanged(result), result


def test_a_changed_subnetwork_the_caller_asked_for_is_still_refused(fake: FakeComputeServer) -> None:
    fake.api.networks["default"] = None
    run_module(fake.endpoint, **BASE)
    result = run_module(fake.endpoint, subnetwork="other", **BASE)
    assert result["failed"] is True and "differs in subnetwork" in result["msg"]


def test_adding_then_removing_the_gpu_on_a_stopped_vm(fake: FakeComputeServer) -> None:
    """The strict fake refuses a GPU on a MIGRATE VM: the module must order its calls."""
    run_module(fake.endpoint, accelerator_count=0, **BASE)
    added = run_module(fake.endpoint, accelerator_count=1, allow_stop=True, **BASE)
    assert added["changed"] is True and added["accelerators"] == [{"type": "nvidia-tesla-t4", "count": 1}], (
        added
    )
    assert added["actions"] == [
        "stop in us-central1-a",
        "set_scheduling in us-central1-a",
        "set_machine_resources in us-central1-a",
        "start in us-central1-a",
    ]
    removed = run_module(fake.endpoint, accelerator_count=0, allow_stop=True, **BASE)
    assert removed["changed"] is True and removed["accelerators"] == [], removed
    assert removed["actions"][1:3] == [
        "set_machine_resources in us-central1-a",
        "set_scheduling in us-central1-a",
    ]
    assert _unchanged(run_module(fake.endpoint, accelerator_count=0, **BASE))


def test_bigger_shape_with_more_gpus_and_back(fake: FakeComputeServer) -> None:
    """n1-standard-64 needs 4 T4s: the GPUs go first on the way up, the machine type on the way down,
    so that the strict fake never sees a shape the API refuses."""
    run_module(fake.endpoint, **BASE)
    up = run_module(
        fake.endpoint, machine_type="n1-standard-64", accelerator_count=4, allow_stop=True, **BASE
    )
    assert up["changed"] is True and not up.get("failed"), up
    assert up["actions"][1:3] == [
        "set_machine_resources in us-central1-a",
        "set_machine_type in us-central1-a",
    ]
    down = run_module(fake.endpoint, allow_stop=True, **BASE)
    assert down["changed"] is True and not down.get("failed"), down
    assert down["actions"][1:3] == [
        "set_machine_type in us-central1-a",
        "set_machine_resources in us-central1-a",
    ]
    assert (down["machine_type"], down["accelerators"]) == (
        "n1-standard-2",
        [{"type": "nvidia-tesla-t4", "count": 1}],
    )


# ---- failures midway say what they already changed -----------------------------------------------
def test_machine_type_change_whose_start_stocks_out_reports_the_partial_change(
    fake: FakeComputeServer,
) -> None:
    run_module(fake.endpoint, **BASE)
    fake.api.faults.stockout_zones = {"us-central1-a"}  # the T4s went while the VM was stopped
    result = run_module(fake.endpoint, machine_type="n1-standard-4", allow_stop=True, **BASE)
    assert result["failed"] is True and result["changed"] is True, result
    assert result["error_kind"] == "stockout"
    assert result["actions"] == ["stop in us-central1-a", "set_machine_type in us-central1-a"]
    assert result["status"] == "TERMINATED" and result["machine_type"] == "n1-standard-4"
    assert "already done: stop in us-central1-a, set_machine_type in us-central1-a" in result["msg"]
    assert "TERMINATED now" in result["msg"]


def test_stockout_everywhere_returns_every_zone_and_its_reason(fake: FakeComputeServer) -> None:
    fake.api.faults.stockout_zones = set(ZONES)
    result = run_module(fake.endpoint, **BASE)
    assert result["failed"] is True and result["changed"] is False and result["status"] == "ABSENT"
    assert [(z["zone"], z["result"]) for z in result["zones_tried"]] == [(z, "stockout") for z in ZONES]
    for tried in result["zones_tried"]:
        assert tried["reason"].startswith("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: ")
        assert f"zones/{tried['zone']}'" in tried["reason"]
    assert result["actions"] == [f"stockout in {z}" for z in ZONES]


@pytest.mark.timeout(120)  # a hang guard: one wait the module did not cut short would hold 600 s
def test_operation_timeout_names_the_vm_state(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, **BASE)
    fake.api.faults.ops_hang = True
    fake.api.faults.wait_max = 600  # the API holds a wait up to about 2 minutes; the module cuts it
    result = run_module(fake.endpoint, state="stopped", operation_timeout=1, **BASE)
    assert result["failed"] is True and result["error_kind"] == "timeout", result
    assert "(stop) was still RUNNING after operation_timeout=1s" in result["msg"]
    assert "instance rig1 is STOPPING now" in result["msg"]
    assert result["changed"] is True and result["status"] == "STOPPING"


def test_throttled_waits_after_an_accepted_change_report_it_as_changed(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, **BASE)
    fake.api.faults.op_delay = 0.5  # so the stop is still running when the module starts waiting
    fake.api.faults.status_429, fake.api.faults.status_429_suffix = 10**6, "/wait"
    result = run_module(fake.endpoint, state="stopped", retry_deadline=0.5, **BASE)
    assert result["failed"] is True and result["error_kind"] == "throttled", result
    assert result["changed"] is True and "the API accepted the request" in result["msg"]
    assert fake.api.requests("POST", "/stop")


# ---- retries ------------------------------------------------------------------------------------
def test_dropped_connection_after_insert_is_retried_with_the_same_request_id(fake: FakeComputeServer) -> None:
    fake.api.faults.insert_drop_after = 1  # the VM is being made, the reply never arrives
    result = run_module(fake.endpoint, **BASE)
    assert result["changed"] is True and result["status"] == "RUNNING", result
    inserts = fake.api.requests("POST", "/instances")
    assert len(inserts) == 2 and len({r["query"]["requestId"] for r in inserts}) == 1
    assert len(fake.api.instances) == 1


def test_every_changing_call_carries_a_request_id(fake: FakeComputeServer) -> None:
    run_module(fake.endpoint, **BASE)
    run_module(fake.endpoint, labels={"a": "b"}, machine_type="n1-standard-4", allow_stop=True, **BASE)
    run_module(fake.endpoint, state="absent", delete_data_disk=True, **BASE)
    mutations = fake.api.mutating_requests()
    assert len(mutations) == 7
    assert all(uuid.UUID(r["query"]["requestId"]) for r in mutations)


def test_throttling_until_the_deadline_fails_saying_so(fake: FakeComputeServer) -> None:
    fake.api.faults.status_429 = 10**6
    result = run_module(fake.endpoint, retry_deadline=0.5, **BASE)
    assert result["failed"] is True and result["error_kind"] == "throttled", result
    assert "throttling" in result["msg"] and "429" in result["msg"] and "retry_deadline" in result["msg"]
    assert result["status"] == "UNKNOWN"  # not read again: that would be throttled for as long again


# ---- numbers refused before any request ---------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"boot_disk": {"size_gb": 0}}, "boot_disk.size_gb=0 is too small"),
        ({"boot_disk": {"size_gb": -1}}, "boot_disk.size_gb=-1 is too small"),
        ({"data_disk": {"size_gb": 0}}, "data_disk.size_gb=0 is too small"),
        ({"data_disk": {"size_gb": 70000}}, "data_disk.size_gb=70000 is too big"),
        ({"accelerator_count": -1}, "accelerator_count=-1 is negative"),
        ({"accelerator_count": 3}, "accelerator_count=3 is not allowed for nvidia-tesla-t4"),
        ({"accelerator_count": 8}, "accelerator_count=8 is not allowed for nvidia-tesla-t4"),
        (
            {"machine_type": "n1-standard-64"},
            "accelerator_count=1 is too few for machine_type=n1-standard-64",
        ),
        ({"machine_type": "n1-highmem-64", "accelerator_count": 2}, "use accelerator_count=4"),
        ({"machine_type": "e2-standard-4"}, "machine_type=e2-standard-4 takes no nvidia-tesla-t4"),
        ({"machine_type": "g1-small"}, "shared-core machine_type=g1-small takes no GPU"),
        ({"operation_timeout": 0}, "operation_timeout=0 must be greater than 0"),
    ],
)
def test_bad_numbers_are_refused_before_any_request(
    fake: FakeComputeServer, options: dict, words: str
) -> None:
    result = run_module(fake.endpoint, **dict(BASE, **options))
    assert result["failed"] is True and result["error_kind"] == "invalid", result
    assert words in result["msg"] and "\n" not in result["msg"]
    assert fake.api.log == []


@pytest.mark.parametrize(
    ("machine_type", "count"),
    [
        ("n1-standard-2", 1),
        ("custom-48-319488", 1),
        ("n1-standard-32", 2),
        ("n1-standard-96", 4),
        ("custom-8-30720", 2),
    ],
)
def test_allowed_gpu_shapes_pass_the_local_check(
    fake: FakeComputeServer, machine_type: str, count: int
) -> None:
    result = run_module(fake.endpoint, machine_type=machine_type, accelerator_count=count, **BASE)
    assert result["changed"] is True and result["accelerators"] == [
        {"type": "nvidia-tesla-t4", "count": count}
    ]
