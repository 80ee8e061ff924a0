#!/usr/bin/python
"""Ansible module: one custom IAM role of a project, present (undeleted if need be) or absent."""

from __future__ import annotations

# ruff: noqa: E402 - Ansible modules keep DOCUMENTATION/EXAMPLES/RETURN above the imports.

DOCUMENTATION = r"""
---
module: gce_iam_role
short_description: Create, update, undelete or delete one project-level custom role
description:
  - Makes sure the custom role C(projects/PROJECT/roles/ROLE_ID) holds exactly O(permissions), with
    O(title), O(description) and O(stage), or is deleted. Used by gemma-rig for the roles of the
    gateway's rig-waker (docs/gateway.md).
  - Deleting a custom role is soft; IAM keeps it, C(deleted) true, for 7 days (it can be
    undeleted) and its id cannot be given to a new role for a while longer. So a role found
    deleted is undeleted, then updated if it differs, rather than created again (which would
    fail); O(state=absent) on a deleted role changes nothing.
  - Uses google-cloud-iam's official client (C(iam_admin_v1), gRPC, as the package has no REST
    transport). The google.cloud collection's C(gcp_iam_role) was not kept; it cannot be pointed
    at a local fake API, which is how gemma-rig tests every cloud module.
  - Every write carries the etag read, so a change made meanwhile by someone else is refused
    (409) instead of overwritten.
version_added: "0.2.0"
author: gemma-rig contributors !UNKNOWN
requirements:
  - google-cloud-iam >= 2.27
extends_documentation_fragment: [google_cloud, google_cloud.state]
options:
  role_id:
    description: The role's id (C([a-zA-Z0-9_.]), 3-64 characters).
    type: str
    required: true
  title:
    description: The role's title.
    type: str
    default: ""
  description:
    description: The role's description.
    type: str
    default: ""
  permissions:
    description: The permissions the role includes, exactly (others are removed). Required with O(state=present).
    type: list
    elements: str
    default: []
  stage:
    description: The role's launch stage.
    type: str
    choices: [ALPHA, BETA, GA, DEPRECATED, DISABLED, EAP]
    default: GA
notes:
  - O(api_endpoint) is the IAM API's gRPC address; C(http://host:port) is reached over a
    plain-text channel (a local fake API only).
"""

EXAMPLES = r"""
- name: The waker's role on each rig instance
  gce_iam_role:
    project: my-project
    role_id: gemmaRigWaker
    title: gemma-rig waker
    permissions: [compute.instances.get, compute.instances.start]
"""

RETURN = r"""
name:
  description: The role's name, C(projects/PROJECT/roles/ROLE_ID), what a binding names.
  returned: always
  type: str
role:
  description: The role as it stands (title, description, permissions, stage, deleted), null when it never existed.
  returned: always
  type: dict
undeleted:
  description: The role was found deleted and was undeleted (or would be, in check mode).
  returned: always
  type: bool
"""

from typing import Any

from ansible.module_utils.gce_client import PRESENT_OR_ABSENT, cloud_module
from ansible.module_utils.gce_iam import describe, get_or_none, iam_admin_client, open_client
from ansible.module_utils.gce_retry import make_retry

# update_mask paths of the fields this module owns, by the names summarize() uses.
MASK = {
    "title": "title",
    "description": "description",
    "permissions": "included_permissions",
    "stage": "stage",
}


def summarize(role: Any) -> dict[str, Any]:
    """The compared fields of a Role message (or None)."""
    if role is None:
        return {}
    return {
        "title": role.title,
        "description": role.description,
        "permissions": sorted(role.included_permissions),
        "stage": role.stage.name,
        "deleted": bool(role.deleted),
    }


def main() -> None:
    module = cloud_module(
        {
            "role_id": {"type": "str", "required": True},
            "title": {"type": "str", "default": ""},
            "description": {"type": "str", "default": ""},
            "permissions": {"type": "list", "elements": "str", "default": []},
            "stage": {
                "type": "str",
                "default": "GA",
                "choices": ["ALPHA", "BETA", "GA", "DEPRECATED", "DISABLED", "EAP"],
            },
            "state": PRESENT_OR_ABSENT,
        }
    )
    p = module.params
    if p["state"] == "present" and not p["permissions"]:
        module.fail_json(msg="permissions must list what the role includes")
    client = open_client(module, iam_admin_client, "google-cloud-iam")
    # Both installed: open_client has checked (iam_admin_client imports iam_admin_v1).
    from google.cloud import iam_admin_v1
    from google.protobuf import field_mask_pb2

    parent = f"projects/{p['project']}"
    name = f"{parent}/roles/{p['role_id']}"
    retry = make_retry()
    wanted = {
        "title": p["title"],
        "description": p["description"],
        "permissions": sorted(set(p["permissions"])),
        "stage": p["stage"],
    }
    undeleted = False
    try:
        current = get_or_none(client.get_role, retry, request={"name": name})
        before = summarize(current)
        if p["state"] == "absent":
            changed = bool(before) and not before["deleted"]
            after = dict(before, deleted=True) if before else {}
            if changed and not module.check_mode:
                after = summarize(
                    client.delete_role(request={"name": name, "etag": current.etag}, retry=retry)
                )
        elif current is None:
            changed, after = True, dict(wanted, deleted=False)
            if not module.check_mode:
                role = iam_admin_v1.Role(
                    title=wanted["title"],
                    description=wanted["description"],
                    included_permissions=wanted["permissions"],
                    stage=wanted["stage"],
                )
                try:
                    made = client.create_role(
                        request={"parent": parent, "role_id": p["role_id"], "role": role}, retry=retry
                    )
                    after = summarize(made)
                except Exception as exc:
                    if getattr(exc, "code", None) != 409:
                        raise
                    # Another run (a second gateway) made it since the read: converge on it below.
                    current = client.get_role(request={"name": name}, retry=retry)
        if p["state"] == "present" and current is not None:
            found = summarize(current)  # before, or what another run made since
            undeleted = found["deleted"]
            etag = current.etag
            if undeleted and not module.check_mode:
                etag = client.undelete_role(request={"name": name, "etag": etag}, retry=retry).etag
            drift = [k for k in MASK if found[k] != wanted[k]]
            changed = undeleted or bool(drift) or not before
            after = dict(wanted, deleted=False)
            if drift and not module.check_mode:
                role = iam_admin_v1.Role(
                    name=name,
                    title=wanted["title"],
                    description=wanted["description"],
                    included_permissions=wanted["permissions"],
                    stage=wanted["stage"],
                    etag=etag,
                )
                updated = client.update_role(
                    request={
                        "name": name,
                        "role": role,
                        "update_mask": field_mask_pb2.FieldMask(paths=[MASK[k] for k in drift]),
                    },
                    retry=retry,
                )
                after = summarize(updated)
    except Exception as exc:
        module.fail_json(msg=describe(exc, "IAM API"))
    module.exit_json(
        changed=changed,
        name=name,
        role=after or None,
        undeleted=undeleted,
        diff={"before": before, "after": after},
    )


if __name__ == "__main__":
    main()
