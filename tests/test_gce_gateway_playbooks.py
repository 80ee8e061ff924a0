"""The gateway VM on Compute Engine: provision_gce_gateways.yml, gateway.yml and teardown against the
fake Compute API, with the project's example inventory (inventory/gateway-gce.yml) and its group
vars (inventory/group_vars/gce_gateways.yml: the VM's shape and its firewall rule)."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN
from tests.fake_compute import FakeComputeServer, Faults, iam
from tests.fake_compute.iam import FakeIamServer

# Each test starts ansible-playbook (module start-up imports google-cloud-compute: seconds each);
# the first provisioning (two gateway VMs) serves the VM's shape, each VM's own rule and the second
# run's idempotence alike.
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

GATEWAY = "gemma-gateway-1"  # the example inventory's host
KEY = "gw-test-0123456789abcdef"
SECOND = "gemma-gateway-2"  # a second gateway VM, beside the example's


@pytest.fixture
def fake() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(Faults(op_delay=0.05, stockout_zones={"us-central1-a"})) as server:
        yield server


@pytest.fixture
def extra(tmp_path: Path) -> Path:
    """What a user sets for the example inventory: project, zones, key, client ranges and keys."""
    key = tmp_path / "id_test.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaTEST rig@test\n")
    path = tmp_path / "extra.yml"  # stands in for the inventory's values and an ansible-vault file
    path.write_text(
        yaml.safe_dump(
            {
                "gce_project": "proj",
                "gce_zones": ["us-central1-a", "us-central1-b"],
                "gce_ssh_public_key_file": str(key),
                # The VM's pinned host keys stay with the test, out of the project's build/.
                "gce_known_hosts_file": str(tmp_path / "known_hosts"),
                "gateway_source_ranges": ["198.51.100.0/24"],
                "gateway_api_keys": {"client": KEY},
            }
        )
    )
    return path


def _play(
    playbook: str, fake: FakeComputeServer, extra: Path, *more: str, inventories: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    cmd = [
        str(VENV_BIN / "ansible-playbook"), "-i", "inventory/gateway-gce.yml",
        *(a for inv in inventories for a in ("-i", inv)), playbook,
        "-e", f"@{extra}", "-e", f"gce_api_endpoint={fake.endpoint}", "-e", "gce_auth_kind=anonymous",
        "-e", "gce_ssh_wait_timeout=1", *more,
    ]  # fmt: skip
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)


def _task_output(out: str, task: str) -> str:
    """The lines Ansible printed for one task (up to the next TASK or PLAY header)."""
    start = out.index(f"TASK [{task}]")
    following = [i for i in (out.find("\nTASK [", start + 1), out.find("\nPLAY ", start + 1)) if i > 0]
    return out[start : min(following, default=len(out))]


def _item_output(task: str, item: str) -> str:
    """One loop item's result in a task's output (from its "=> (item=ITEM)" line to the next result)."""
    chunks = re.split(r"\n(?=(?:ok|changed|failed|fatal|skipping): \[)", task)
    (mine,) = [c for c in chunks if f"(item={item})" in c.split("\n", 1)[0]]
    return mine


def _second_gateway(tmp_path: Path) -> Path:
    """An inventory adding a second gateway VM, gemma-gateway-2, to the example's."""
    second = tmp_path / "second.yml"
    second.write_text(yaml.safe_dump({"gateways": {"children": {"gce_gateways": {"hosts": {SECOND: None}}}}}))
    return second


def test_gateway_vm_is_small_only_its_port_is_open_and_a_second_run_changes_nothing(
    fake: FakeComputeServer, extra: Path, tmp_path: Path
) -> None:
    """The first provisioning's VM, rule and inventory entry; then, against the filled-in fake, a
    second run, check mode and the teardown. Two gateway VMs (the example's and SECOND): each rule
    targets only its own VM's tag, so one VM's ranges never reach the other's port, and each VM
    carries only its own among them. (A shared tag, as gce_tags once was the rules' target, opened
    every VM to every rule's ranges.)"""
    inventories = (str(_second_gateway(tmp_path)),)
    result = _play("playbooks/provision_gce_gateways.yml", fake, extra, "-v", inventories=inventories)
    out = result.stdout + result.stderr
    # The VM's IP is unroutable (TEST-NET-3): the play gets as far as the SSH wait and fails there.
    assert result.returncode == 2, out
    assert "TASK [gce : Wait for SSH on the VM]" in out
    assert re.search(r"Timeout when waiting for (search string OpenSSH in )?203\.0\.113\.\d+:22", out), out[
        -3000:
    ]
    inserts = fake.api.requests("POST", "/instances")
    tags = {r["body"]["name"]: r["body"]["tags"]["items"] for r in inserts}
    assert tags == {
        GATEWAY: ["gemma-gateway", GATEWAY],
        SECOND: ["gemma-gateway", SECOND],
    }
    body = [r["body"] for r in inserts if r["body"]["name"] == GATEWAY][-1]
    assert body["machineType"] == "zones/us-central1-b/machineTypes/e2-small"
    assert not body.get("guestAccelerators")
    assert [d["deviceName"] for d in body["disks"]] == [GATEWAY]  # the boot disk only
    boot = body["disks"][0]
    assert boot["autoDelete"] is True and boot["initializeParams"]["diskSizeGb"] in (10, "10")
    assert boot["initializeParams"]["diskType"].endswith("/diskTypes/pd-balanced")
    assert body["tags"]["items"] == ["gemma-gateway", GATEWAY]  # the shared tag, and its own
    assert body["labels"] == {"app": "gemma-rig", "role": "gateway"}
    # No data disk was made: each VM's boot disk only.
    assert sorted(fake.api.disks) == [("us-central1-b", GATEWAY), ("us-central1-b", SECOND)]

    assert sorted(fake.api.firewalls) == [f"{GATEWAY}-gateway", f"{SECOND}-gateway"], out[-3000:]
    rule = fake.api.firewalls[f"{GATEWAY}-gateway"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["8443"]}]  # gateway_port only
    assert rule["sourceRanges"] == ["198.51.100.0/24"] and rule["targetTags"] == [GATEWAY]
    assert rule["network"].endswith("/global/networks/default")
    assert fake.api.firewalls[f"{SECOND}-gateway"]["targetTags"] == [SECOND]
    assert KEY not in out

    # The in-memory inventory: a gateway (not a rig), with the internal address its peers reach.
    task = _item_output(
        _task_output(out, "gce : Add the VM to the inventory (gateways and gce_gateways)"), GATEWAY
    )
    added = yaml.safe_load(
        textwrap.dedent(task[task.index("    add_host:") : task.index("    ansible_loop_var")])
    )
    added = added["add_host"]
    assert sorted(added["groups"]) == ["gateways", "gce_gateways"]
    assert added["host_vars"]["gce_internal_ip"].startswith("10.")
    assert "rig_endpoint_open" not in added["host_vars"]
    after_first = list(fake.api.mutating_requests())

    # Against the filled-in fake (subnetwork, networkIP, fingerprints...): reads only.
    second = _play("playbooks/provision_gce_gateways.yml", fake, extra, inventories=inventories)
    out = second.stdout + second.stderr
    assert "TASK [gce : Wait for SSH on the VM]" in out, out
    for task in (
        "gce : Create or update the VM",
        "gce : Open the endpoint to the listed ranges, or make sure it is closed",
    ):
        seen = _task_output(out, task)
        assert f"ok: [{GATEWAY}" in seen and f"ok: [{SECOND}" in seen and "changed:" not in seen, seen
    assert fake.api.mutating_requests() == after_first
    assert "did nothing" in _task_output(out, "gce : Report where the VM landed")

    check = _play(
        "playbooks/provision_gce_gateways.yml", fake, extra, "--check", "--diff", inventories=inventories
    )
    assert check.returncode == 0, check.stdout
    assert fake.api.mutating_requests() == after_first

    gone = _play("teardown.yml", fake, extra, inventories=inventories)
    text = " ".join((gone.stdout + gone.stderr).split())
    assert gone.returncode == 0, text
    assert fake.api.instances == {} and fake.api.firewalls == {} and fake.api.disks == {}
    assert (
        f"removed: delete instance {GATEWAY} in us-central1-b; delete firewall rule {GATEWAY}-gateway" in text
    )
    assert "nothing of this gateway still costs money" in text


def test_check_mode_on_an_empty_project_changes_nothing(fake: FakeComputeServer, extra: Path) -> None:
    result = _play("playbooks/provision_gce_gateways.yml", fake, extra, "--check", "--diff")
    assert result.returncode == 0, result.stdout
    assert fake.api.mutating_requests() == []
    assert "e2-small" in result.stdout  # the diff shows the planned VM


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        ({"gateway_source_ranges": ["0.0.0.0/0"]}, "0.0.0.0/0"),
        ({"gateway_source_ranges": []}, "gateway_source_ranges"),
        ({"gateway_api_keys": {"client": "short"}}, "gateway_api_keys"),
    ],
)
def test_the_gateway_port_is_refused_to_the_world_and_without_keys(
    fake: FakeComputeServer, extra: Path, tmp_path: Path, override: dict, expect: str
) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(override))
    result = _play("playbooks/provision_gce_gateways.yml", fake, extra, "-e", f"@{bad}")
    out = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2 and expect in out, out[-3000:]
    assert fake.api.mutating_requests() == []  # refused before any change


def test_gateway_yml_provisions_the_vm_and_rigs_stay_closed(
    fake: FakeComputeServer, extra: Path, tmp_path: Path
) -> None:
    """The rig's provisioning, then gateway.yml: the rig behind the gateway gets no firewall rule of
    its own (gce_internal_endpoint), and gateway.yml makes the gateway VM and its one rule.

    With wake on request (gateway_wake), the same runs make the waker's identity (docs/gateway.md,
    "Its permissions on Compute Engine"): its account, its two custom roles, the operations role
    bound on the project and the instance role on the rig's instance only, the gateway VM running as
    the account; then, acting as that account, starting the rig is allowed and starting the gateway
    VM (a VM of the same project that is no rig) is Compute's 403; a second run and check mode send
    no changing request; teardown removes what was made."""
    rigs = tmp_path / "rigs.yml"
    rigs.write_text(
        yaml.safe_dump(
            {
                "rigs": {
                    "children": {
                        "gce": {
                            # Host vars: inventory/group_vars/all/rig.yml's empty list beats a group's.
                            # gateway_wake_zone: where wake on request finds the instance, since
                            # the rig's provisioning (which records its zone) fails at the SSH
                            # wait here, and so ends a run of site.yml gateway.yml.
                            "hosts": {
                                "rig-test": {
                                    "rig_endpoint_source_ranges": ["10.128.0.0/9"],
                                    "gateway_wake_zone": "us-central1-b",
                                }
                            },
                            "vars": {"gce_internal_endpoint": True},
                        }
                    }
                }
            }
        )
    )
    secrets = tmp_path / "vault.yml"
    secrets.write_text(yaml.safe_dump({"rig_api_key": "sk-rig-0123456789abcdef"}))
    result = _play("playbooks/provision_gce.yml", fake, extra, "-e", f"@{secrets}", inventories=(str(rigs),))
    out = result.stdout + result.stderr
    assert "TASK [gce : Wait for SSH on the VM]" in out, out
    assert ("us-central1-b", "rig-test") in fake.api.instances
    assert fake.api.firewalls == {}  # the rig's endpoint is for the VPC only: no rule

    with FakeIamServer(fake.api) as iam_api:
        wake = tmp_path / "wake.yml"
        wake.write_text(
            yaml.safe_dump(
                {
                    "gateway_wake": True,
                    "gce_waker_iam_api_endpoint": iam_api.endpoint,
                    "gce_waker_resource_manager_api_endpoint": fake.endpoint,
                }
            )
        )
        more = ("-e", f"@{secrets}", "-e", f"@{wake}")
        gateway = _play("gateway.yml", fake, extra, *more, inventories=(str(rigs),))
        out = gateway.stdout + gateway.stderr
        assert (
            "PLAY [Provision Compute Engine gateways]" in out and "TASK [gce : Wait for SSH on the VM]" in out
        ), out
        assert ("us-central1-b", GATEWAY) in fake.api.instances
        assert list(fake.api.firewalls) == [f"{GATEWAY}-gateway"]
        assert "sk-rig-0123456789abcdef" not in out and KEY not in out
        _assert_waker_identity(fake, out)

        # One check-mode run serves both claims: a module decides `changed` the same way in check
        # mode (fetch, compare), so no change reported is what a second run would do, and check
        # mode sends no changing request.
        after_first = list(fake.api.mutating_requests())
        again = _play("gateway.yml", fake, extra, *more, "--check", "--diff", inventories=(str(rigs),))
        text = again.stdout + again.stderr
        for task in WAKER_TASKS:
            assert f"TASK [gce : {task}]" in text, text[-3000:]
            report = text.split(f"TASK [gce : {task}]", 1)[1].split("TASK [", 1)[0]
            assert "changed:" not in report and "ok:" in report, report
        assert fake.api.mutating_requests() == after_first

        gone = _play("teardown.yml", fake, extra, *more, inventories=(str(rigs),))
        text = " ".join((gone.stdout + gone.stderr).split())
        assert gone.returncode == 0, text[-3000:]
        state = iam.of(fake.api)
        assert fake.api.instances == {} and state.accounts == {}
        assert {name: role.get("deleted") for name, role in state.roles.items()} == {
            f"projects/proj/roles/{WAKER_ROLE}": True,
            f"projects/proj/roles/{WAKER_OPS_ROLE}": True,
        }
        assert "bindings" not in state.project_policies["proj"]


WAKER = "gemma-rig-waker@proj.iam.gserviceaccount.com"
WAKER_TASKS = (
    "Make the waker's service account",
    "Make the waker's custom roles",
    "Bind the operations role on the project",
    "Bind the instance role on each rig's instance",
)
WAKER_ROLE = "gemmaRigWaker"
WAKER_OPS_ROLE = "gemmaRigWakerOperations"


def _as_waker(fake: FakeComputeServer, method: str, path: str) -> int:
    """The HTTP status the fake answers a request made with the waker's token (rig-waker's own calls)."""
    request = urllib.request.Request(
        f"{fake.endpoint}/compute/v1/projects/proj/zones/us-central1-b/{path}",
        method=method,
        headers={"Authorization": "Bearer waker-token"},
        data=b"" if method == "POST" else None,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def _assert_waker_identity(fake: FakeComputeServer, out: str) -> None:
    """What the provisioning made for the waker, and what its token may do (the fake enforces the
    policies: iam.FakeIam.allows)."""
    state = iam.of(fake.api)
    assert list(state.accounts) == [WAKER], out[-3000:]
    roles = {name: role["includedPermissions"] for name, role in state.roles.items()}
    assert roles == {
        f"projects/proj/roles/{WAKER_ROLE}": ["compute.instances.get", "compute.instances.start"],
        f"projects/proj/roles/{WAKER_OPS_ROLE}": [
            "compute.zoneOperations.get",
            "compute.zoneOperations.list",
        ],
    }
    member = f"serviceAccount:{WAKER}"
    assert state.project_policies["proj"]["bindings"] == [
        {"role": f"projects/proj/roles/{WAKER_OPS_ROLE}", "members": [member]}
    ]
    rig = fake.api.instances[("us-central1-b", "rig-test")]
    gateway = fake.api.instances[("us-central1-b", GATEWAY)]
    assert state.instance_policies[rig["id"]]["bindings"] == [
        {"role": f"projects/proj/roles/{WAKER_ROLE}", "members": [member]}
    ]
    assert gateway["id"] not in state.instance_policies
    # The gateway VM runs as the waker, with the cloud-platform scope (the roles are the limit).
    assert gateway["serviceAccounts"] == [
        {"email": WAKER, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
    ]

    # Any process on the gateway VM can take this token from the metadata server.
    iam.act_as(fake, "waker-token", WAKER)
    assert _as_waker(fake, "POST", "instances/rig-test/start") == 200
    assert _as_waker(fake, "GET", "instances/rig-test") == 200
    ops = [op for op in fake.api.operations.values() if op["operationType"] == "start"]
    assert _as_waker(fake, "GET", f"operations/{ops[-1]['name']}") == 200
    assert _as_waker(fake, "GET", "operations") == 200
    # Hostile: the same token on a VM of the project that is no rig, or anything beyond start.
    assert _as_waker(fake, "POST", f"instances/{GATEWAY}/start") == 403
    assert _as_waker(fake, "GET", f"instances/{GATEWAY}") == 403
    assert _as_waker(fake, "POST", "instances/rig-test/stop") == 403
    assert _as_waker(fake, "DELETE", "instances/rig-test") == 403
    assert _as_waker(fake, "GET", "instances/rig-test/getIamPolicy") == 403
    # Back to no checks: the playbook runs that follow send no token.
    fake.httpd.RequestHandlerClass.permissions = None
