#!/usr/bin/python
"""Ansible module: one service account of a project, present or absent."""

from __future__ import annotations

# ruff: noqa: E402 - Ansible modules keep DOCUMENTATION/EXAMPLES/RETURN above the imports.

DOCUMENTATION = r"""
---
module: gce_iam_account
short_description: Create, update or delete one service account
description:
  - Makes sure the service account O(account_id) of O(project) exists with O(display_name) and
    O(description), or does not exist. Used by gemma-rig for the gateway's rig-waker, whose VM runs
    as that account (docs/gateway.md).
  - Uses google-cloud-iam's official client (C(iam_admin_v1), gRPC, as the package has no REST
    transport). The google.cloud collection's C(gcp_iam_service_account) was not kept; it builds
    its URLs on C(iam.googleapis.com) and cannot be pointed at a local fake API, which is how
    gemma-rig tests every cloud module.
  - Reads first, and sends a change only where the account differs (idempotent). An account a
    concurrent run made between the read and the create (409) is read again, not an error.
version_added: "0.2.0"
author: gemma-rig contributors !UNKNOWN
requirements:
  - google-cloud-iam >= 2.27
extends_documentation_fragment: [google_cloud, google_cloud.state]
options:
  account_id:
    description: The account's id, the part of its email before C(@) (6-30 characters).
    type: str
    required: true
  display_name:
    description: The account's display name.
    type: str
    default: ""
  description:
    description: The account's description.
    type: str
    default: ""
notes:
  - O(api_endpoint) is the IAM API's gRPC address; C(http://host:port) is reached over a
    plain-text channel (a local fake API only).
"""

EXAMPLES = r"""
- name: The gateway waker's service account
  gce_iam_account:
    project: my-project
    account_id: gemma-rig-waker
    display_name: gemma-rig gateway waker
"""

RETURN = r"""
email:
  description: The account's email (whether or not it exists).
  returned: always
  type: str
  sample: gemma-rig-waker@my-project.iam.gserviceaccount.com
account:
  description: The account as it stands (email, unique_id, display_name, description), null when absent.
  returned: always
  type: dict
"""

from typing import Any

from ansible.module_utils.gce_client import PRESENT_OR_ABSENT, cloud_module
from ansible.module_utils.gce_iam import describe, get_or_none, iam_admin_client, open_client
from ansible.module_utils.gce_retry import make_retry


def summarize(account: Any) -> dict[str, Any]:
    """The fields compared and returned, from a ServiceAccount message (or None)."""
    if account is None:
        return {}
    return {
        "email": account.email,
        "unique_id": account.unique_id,
        "display_name": account.display_name,
        "description": account.description,
    }


def main() -> None:
    module = cloud_module(
        {
            "account_id": {"type": "str", "required": True},
            "display_name": {"type": "str", "default": ""},
            "description": {"type": "str", "default": ""},
            "state": PRESENT_OR_ABSENT,
        }
    )
    p = module.params
    client = open_client(module, iam_admin_client, "google-cloud-iam")
    # Both installed: open_client has checked (iam_admin_client imports iam_admin_v1).
    from google.cloud import iam_admin_v1
    from google.protobuf import field_mask_pb2

    email = f"{p['account_id']}@{p['project']}.iam.gserviceaccount.com"
    name = f"projects/{p['project']}/serviceAccounts/{email}"
    retry = make_retry()
    try:
        current = get_or_none(client.get_service_account, retry, request={"name": name})
        before = summarize(current)
        wanted = {"display_name": p["display_name"], "description": p["description"]}
        if p["state"] == "absent":
            after: dict[str, Any] = {}
            changed = current is not None
            if changed and not module.check_mode:
                client.delete_service_account(request={"name": name}, retry=retry)
        elif current is None:
            changed = True
            after = dict(wanted, email=email, unique_id="")
            if not module.check_mode:
                try:
                    made = client.create_service_account(
                        request={
                            "name": f"projects/{p['project']}",
                            "account_id": p["account_id"],
                            "service_account": iam_admin_v1.ServiceAccount(**wanted),
                        },
                        retry=retry,
                    )
                except Exception as exc:
                    if getattr(exc, "code", None) != 409:
                        raise
                    # Another run made it between the read and the create: it exists now.
                    made = client.get_service_account(request={"name": name}, retry=retry)
                    changed = False
                after = summarize(made)
        else:
            drift = [k for k, v in wanted.items() if before[k] != v]
            changed = bool(drift)
            after = dict(before, **wanted)
            if changed and not module.check_mode:
                patched = client.patch_service_account(
                    request={
                        "service_account": iam_admin_v1.ServiceAccount(name=name, **wanted),
                        "update_mask": field_mask_pb2.FieldMask(paths=drift),
                    },
                    retry=retry,
                )
                after = summarize(patched)
    except Exception as exc:
        module.fail_json(msg=describe(exc, "IAM API"))
    module.exit_json(
        changed=changed, email=email, account=after or None, diff={"before": before, "after": after}
    )


if __name__ == "__main__":
    main()
