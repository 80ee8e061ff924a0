"""The IAM modules (gce_iam_account, gce_iam_role, gce_iam_binding) in-process against the fake
(tests/fake_compute/iam.py): a soft-deleted role is undeleted, a policy write that raced another
is done again without losing the other's binding, check mode sends nothing, and the fake holds a
token acting as a service account to the policies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fake_compute import FakeComputeServer, Faults, harness, iam
from tests.fake_compute.iam import FakeIamServer

for _name in ("gce_iam_account", "gce_iam_role", "gce_iam_binding"):
    harness.MODULES.setdefault(_name, harness.load(_name))
    harness.PRESETS.setdefault(_name, {"auth_kind": "anonymous"})

PROJECT = "proj-iam"
EMAIL = f"waker-sa@{PROJECT}.iam.gserviceaccount.com"
ROLE = f"projects/{PROJECT}/roles/wakerRole"
PERMS = ["compute.instances.get", "compute.instances.start"]


@pytest.fixture
def apis() -> Iterator[tuple[FakeComputeServer, FakeIamServer]]:
    with FakeComputeServer(Faults()) as fake, FakeIamServer(fake.api) as admin:
        fake.api.seed_instance(PROJECT, "us-central1-b", "rig-a")
        yield fake, admin


def _role(admin: FakeIamServer, **params: Any) -> dict[str, Any]:
    return harness.run_module(
        admin.endpoint, module="gce_iam_role", project=PROJECT, role_id="wakerRole", **params
    )


def test_a_soft_deleted_role_is_undeleted_and_updated(apis: tuple[FakeComputeServer, FakeIamServer]) -> None:
    fake, admin = apis
    assert _role(admin, title="t", permissions=PERMS[:1])["changed"]
    assert _role(admin, state="absent")["changed"]
    assert iam.of(fake.api).roles[ROLE]["deleted"] is True  # soft: still there, its id held
    assert not _role(admin, state="absent")["changed"]  # deleted already
    check = _role(admin, check=True, title="t", permissions=PERMS)
    assert check["changed"] and check["undeleted"] and iam.of(fake.api).roles[ROLE]["deleted"]
    result = _role(admin, title="t", permissions=PERMS)
    assert result["changed"] and result["undeleted"], result
    stored = iam.of(fake.api).roles[ROLE]
    assert "deleted" not in stored and stored["includedPermissions"] == PERMS
    assert [r["path"] for r in fake.api.log if r["path"].endswith(":undelete")] == [f"/v1/{ROLE}:undelete"]
    assert not _role(admin, title="t", permissions=PERMS)["changed"]


def test_a_policy_write_that_raced_another_is_redone_keeping_both(
    apis: tuple[FakeComputeServer, FakeIamServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, admin = apis
    state = iam.of(fake.api)
    harness.run_module(admin.endpoint, module="gce_iam_account", project=PROJECT, account_id="waker-sa")
    _role(admin, title="t", permissions=PERMS)
    # Someone else's binding arrives between this run's read and its write (the first time only).
    original = state.set_project_policy
    raced: list[bool] = []

    def racing(project: str, body: dict[str, Any]) -> dict[str, Any]:
        if not raced:
            raced.append(True)
            original(
                project,
                {"policy": {"bindings": [{"role": "roles/viewer", "members": ["user:a@example.com"]}]}},
            )
        return original(project, body)

    monkeypatch.setattr(state, "set_project_policy", racing)
    params = {"module": "gce_iam_binding", "project": PROJECT, "resource": "project", "role": ROLE}
    result = harness.run_module(fake.endpoint, member=f"serviceAccount:{EMAIL}", **params)
    assert result["changed"], result
    sets = [r for r in fake.api.log if r["path"].endswith(":setIamPolicy")]
    assert len(sets) == 2  # the first was refused (409 ABORTED, stale etag), the second went through
    assert sorted(state.project_policies[PROJECT]["bindings"], key=lambda b: b["role"]) == [
        {"role": ROLE, "members": [f"serviceAccount:{EMAIL}"]},
        {"role": "roles/viewer", "members": ["user:a@example.com"]},
    ]
    before = list(fake.api.mutating_requests())
    again = harness.run_module(fake.endpoint, member=f"serviceAccount:{EMAIL}", **params)
    assert not again["changed"] and fake.api.mutating_requests() == before


def test_check_mode_and_a_missing_instance(apis: tuple[FakeComputeServer, FakeIamServer]) -> None:
    fake, admin = apis
    harness.run_module(admin.endpoint, module="gce_iam_account", project=PROJECT, account_id="waker-sa")
    _role(admin, title="t", permissions=PERMS)
    before = list(fake.api.mutating_requests())
    params = {
        "module": "gce_iam_binding",
        "project": PROJECT,
        "resource": "instance",
        "zone": "us-central1-b",
    }
    member = f"serviceAccount:{EMAIL}"
    planned = harness.run_module(
        fake.endpoint, check=True, instance="rig-a", role=ROLE, member=member, **params
    )
    assert planned["changed"] and fake.api.mutating_requests() == before
    missing = harness.run_module(fake.endpoint, instance="nope", role=ROLE, member=member, **params)
    assert missing["failed"] and "does not exist" in missing["msg"]
    gone = harness.run_module(
        fake.endpoint, instance="nope", role=ROLE, member=member, state="absent", **params
    )
    assert not gone["changed"]


def test_the_fake_grants_what_the_policies_bind(apis: tuple[FakeComputeServer, FakeIamServer]) -> None:
    """A token acting as an account holds its roles where they are bound, and no more: on the
    bound instance only; nothing once the role is deleted or the account is (and a new account of
    the same email inherits nothing)."""
    fake, admin = apis
    state = iam.of(fake.api)
    fake.api.seed_instance(PROJECT, "us-central1-b", "rig-b")
    harness.run_module(admin.endpoint, module="gce_iam_account", project=PROJECT, account_id="waker-sa")
    _role(admin, title="t", permissions=PERMS)
    member = f"serviceAccount:{EMAIL}"
    params = {
        "module": "gce_iam_binding",
        "project": PROJECT,
        "resource": "instance",
        "zone": "us-central1-b",
    }
    assert harness.run_module(fake.endpoint, instance="rig-a", role=ROLE, member=member, **params)["changed"]
    rig_a = f"projects/{PROJECT}/zones/us-central1-b/instances/rig-a"
    rig_b = f"projects/{PROJECT}/zones/us-central1-b/instances/rig-b"
    assert state.allows(EMAIL, "compute.instances.start", rig_a)
    assert not state.allows(EMAIL, "compute.instances.start", rig_b)
    assert not state.allows(EMAIL, "compute.instances.stop", rig_a)
    _role(admin, state="absent")
    assert not state.allows(EMAIL, "compute.instances.start", rig_a)
    _role(admin, title="t", permissions=PERMS)
    assert state.allows(EMAIL, "compute.instances.start", rig_a)
    harness.run_module(
        admin.endpoint, module="gce_iam_account", project=PROJECT, account_id="waker-sa", state="absent"
    )
    harness.run_module(admin.endpoint, module="gce_iam_account", project=PROJECT, account_id="waker-sa")
    assert not state.allows(EMAIL, "compute.instances.start", rig_a)
    assert fake.api.mismatches == []
