#!/usr/bin/python
"""Ansible module: one member in one role's binding of a project's or an instance's allow policy."""

from __future__ import annotations

# ruff: noqa: E402 - Ansible modules keep DOCUMENTATION/EXAMPLES/RETURN above the imports.

DOCUMENTATION = r"""
---
module: gce_iam_binding
short_description: Grant or revoke one role to one member on a project or on one VM instance
description:
  - Makes sure O(member) is (or is not) in the unconditional binding of O(role) in the allow
    policy of the project (O(resource=project)) or of one Compute Engine instance
    (O(resource=instance), O(zone), O(instance)). Every other binding and member is kept as it is,
    conditional bindings included. Used by gemma-rig to let the gateway's rig-waker start the
    rigs' instances and no other (docs/gateway.md).
  - IAM's read-modify-write. The policy is read (version 3, so conditional bindings are seen and
    kept), changed, and written back with the etag read; when someone else wrote it in between, the
    write is refused (409 ABORTED, or 412 from Compute) and the whole cycle is done again, up to 5
    times.
  - Clients are Google's own - google-cloud-resource-manager's C(resourcemanager_v3.ProjectsClient)
    for a project, google-cloud-compute's C(InstancesClient) for an instance, both over REST. The
    google.cloud collection has no per-instance IAM module, and its project one cannot be pointed
    at a local fake API, which is how gemma-rig tests every cloud module.
  - An instance that does not exist fails O(state=present); with O(state=absent) there is nothing
    to revoke (the policy went with the instance).
version_added: "0.2.0"
author: gemma-rig contributors !UNKNOWN
requirements:
  - google-cloud-resource-manager >= 1.19
  - google-cloud-compute >= 1.56
extends_documentation_fragment: [google_cloud, google_cloud.state]
options:
  resource:
    description: Whose policy - the project's, or one instance's.
    type: str
    choices: [project, instance]
    required: true
  zone:
    description: The instance's zone (O(resource=instance)).
    type: str
  instance:
    description: The instance's name (O(resource=instance)).
    type: str
  role:
    description: The role, C(roles/...) or a custom role's full name C(projects/PROJECT/roles/ID).
    type: str
    required: true
  member:
    description: The principal, for instance C(serviceAccount:EMAIL).
    type: str
    required: true
notes:
  - O(api_endpoint) is Resource Manager's endpoint for O(resource=project), Compute Engine's for
    O(resource=instance).
"""

EXAMPLES = r"""
- name: Let the waker start this rig, and no other VM
  gce_iam_binding:
    project: my-project
    resource: instance
    zone: us-central1-b
    instance: gemma-rig-1
    role: projects/my-project/roles/gemmaRigWaker
    member: serviceAccount:gemma-rig-waker@my-project.iam.gserviceaccount.com
"""

RETURN = r"""
bindings:
  description: The policy's bindings after the run (role, members, condition), as the API holds them.
  returned: always
  type: list
  elements: dict
"""

import json
from typing import Any

from ansible.module_utils.gce_client import PRESENT_OR_ABSENT, cloud_module
from ansible.module_utils.gce_iam import (
    describe,
    instances_client,
    open_client,
    projects_client,
    read_modify_write,
    with_member,
)
from ansible.module_utils.gce_retry import make_retry


class Gone(Exception):
    """The instance does not exist."""


def project_policy(client: Any, project: str, retry: Any) -> tuple[Any, Any]:
    """(read, write) of a project's policy through Resource Manager v3 (google.iam.v1 Policy)."""
    from google.iam.v1 import policy_pb2
    from google.protobuf import json_format

    resource = f"projects/{project}"

    def read() -> tuple[dict[str, Any], bytes, int]:
        policy = client.get_iam_policy(
            request={"resource": resource, "options": {"requested_policy_version": 3}}, retry=retry
        )
        return json_format.MessageToDict(policy), policy.etag, policy.version

    def write(bindings: list[dict[str, Any]], etag: bytes, version: int) -> None:
        policy = json_format.ParseDict({"bindings": bindings}, policy_pb2.Policy())
        policy.etag = etag
        policy.version = version
        client.set_iam_policy(request={"resource": resource, "policy": policy}, retry=retry)

    return read, write


def instance_policy(client: Any, project: str, zone: str, name: str, retry: Any) -> tuple[Any, Any]:
    """(read, write) of an instance's policy through Compute (compute_v1 Policy)."""
    from google.cloud import compute_v1

    def read() -> tuple[dict[str, Any], str, int]:
        try:
            policy = client.get_iam_policy(
                request={
                    "project": project,
                    "zone": zone,
                    "resource": name,
                    "options_requested_policy_version": 3,
                },
                retry=retry,
            )
        except Exception as exc:
            if getattr(exc, "code", None) == 404:
                raise Gone from exc
            raise
        as_dict = json.loads(compute_v1.Policy.to_json(policy, use_integers_for_enums=False))
        return as_dict, policy.etag, policy.version

    def write(bindings: list[dict[str, Any]], etag: str, version: int) -> None:
        policy = compute_v1.Policy.from_json(
            json.dumps({"bindings": bindings, "etag": etag, "version": version})
        )
        client.set_iam_policy(
            project=project,
            zone=zone,
            resource=name,
            zone_set_policy_request_resource=compute_v1.ZoneSetPolicyRequest(policy=policy),
            retry=retry,
        )

    return read, write


def main() -> None:
    module = cloud_module(
        {
            "resource": {"type": "str", "required": True, "choices": ["project", "instance"]},
            "zone": {"type": "str"},
            "instance": {"type": "str"},
            "role": {"type": "str", "required": True},
            "member": {"type": "str", "required": True},
            "state": PRESENT_OR_ABSENT,
        }
    )
    p = module.params
    if p["resource"] == "instance" and not (p["zone"] and p["instance"]):
        module.fail_json(msg="resource=instance needs zone and instance")
    if p["resource"] == "project":
        client = open_client(module, projects_client, "google-cloud-resource-manager")
        read, write = project_policy(client, p["project"], make_retry())
        api = "Resource Manager API"
    else:
        client = open_client(module, instances_client, "google-cloud-compute")
        read, write = instance_policy(client, p["project"], p["zone"], p["instance"], make_retry())
        api = "Compute API"
    present = p["state"] == "present"
    try:
        before, after, changed = read_modify_write(
            read,
            None if module.check_mode else write,
            lambda bindings: with_member(bindings, p["role"], p["member"], present),
        )
    except Gone:
        if present:
            where = f"projects/{p['project']}/zones/{p['zone']}/instances/{p['instance']}"
            module.fail_json(
                msg=f"instance {where} does not exist: there is no policy to bind {p['member']} in"
            )
        module.exit_json(changed=False, bindings=[], diff={"before": {}, "after": {}})
    except Exception as exc:
        module.fail_json(msg=describe(exc, api))
    module.exit_json(changed=changed, bindings=after["bindings"], diff={"before": before, "after": after})


if __name__ == "__main__":
    main()
