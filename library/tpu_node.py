#!/usr/bin/python
"""Ansible module: one Cloud TPU v5e node asked for as a queued resource, with zone fallback."""

# ruff: noqa: E402 - Ansible modules keep DOCUMENTATION/EXAMPLES/RETURN above the imports.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tpu_node
short_description: Create or delete one Cloud TPU VM (a v5e chip by default) through a queued resource
description:
  - Asks the Cloud TPU API for one TPU VM as a queued resource (API C(v2alpha1) queuedResources), by
    default one v5e chip (C(v5litepod-1)) with runtime C(v2-alpha-tpuv5-lite); the queued resource
    and the node have the same name. Nodes and operations are read through google-cloud-tpu's
    C(tpu_v2) client; queued resources go to the C(v2alpha1) REST surface, the only one with
    flex-start (docs/tpu.md, "Which API").
  - Provisioning models - V(flex-start) (half the on-demand price, runs at most
    O(max_run_duration), then the service deletes the node and suspends the queued resource),
    V(spot) (may be preempted at any time) and V(on-demand).
  - Looks for the queued resource and the node in every zone of O(zones) first, so it is never asked
    for twice. When a zone has no capacity (the queued resource fails for capacity, or is still
    waiting after O(zone_wait) seconds), does not offer the accelerator type or the provisioning
    model for it, or the create operation itself fails for capacity, it deletes that request and
    tries the next zone, saying so in a warning and in RV(zones_tried).
  - A quota error fails at once with one line naming the quota (C(TPUV5sLitepodPerProjectPerZoneForTPUAPI)
    for on-demand, C(TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI) for spot and flex-start).
    A quota is told from throttling by the error's structured details (a C(QuotaFailure), or an
    C(ErrorInfo) reason C(RATE_LIMIT_EXCEEDED) for throttling), else by the quota wording of the
    API's own message; throttling is retried within O(retry_deadline).
  - A queued resource being deleted by someone else (C(DELETING)) is waited out, then asked for
    again. A node that will not become READY by waiting (C(UNKNOWN), C(STOPPED), C(STOPPING),
    C(HIDING), C(HIDDEN), C(STATE_UNSPECIFIED)) fails the run at once, naming its state.
  - When the node is gone (flex-start ran its duration, a spot node was preempted) or the queued
    resource is over (C(FAILED), C(SUSPENDING), C(SUSPENDED)), the next run deletes what is left and
    asks again, with C(changed=true) and the reason in RV(recreated_because) and a warning.
  - The accelerator type, runtime version and provisioning model of an existing node are compared;
    a difference fails the run and names it (a TPU VM cannot change them; delete it and converge).
    Labels, metadata and tags apply when the node is made and are not compared.
  - V(absent) deletes the queued resource (with C(force), which deletes its node) and any node of
    that name, then reads every zone again and reports in RV(still_costs) what is left that bills.
version_added: "0.1.0"
author: gemma-rig contributors !UNKNOWN
requirements:
  - google-cloud-tpu >= 1.28
extends_documentation_fragment: [google_cloud]
options:
  zones:
    description:
      - Zones to try, in order. One zone may be given as a string.
      - Flex-start C(v5litepod-1) was accepted only in C(us-west4-a) when this rig was measured.
    type: list
    elements: str
    required: true
  name:
    description: Name of the queued resource and of its node (RFC 1035, at most 63 characters).
    type: str
    required: true
  state:
    description: V(present) makes sure a READY node exists; V(absent) deletes it and its queued resource.
    type: str
    choices: [present, absent]
    default: present
  accelerator_type:
    description: TPU accelerator type.
    type: str
    default: v5litepod-1
  runtime_version:
    description: TPU VM runtime (the VM image).
    type: str
    default: v2-alpha-tpuv5-lite
  provisioning_model:
    description: How the chip is obtained and billed.
    type: str
    choices: [flex-start, spot, on-demand]
    default: on-demand
  max_run_duration:
    description:
      - With O(provisioning_model=flex-start), how long the node runs before the service deletes it
        (C(4h), C(90m), C(3600s), C(1d); at most 7 days). Ignored otherwise.
    type: str
    default: 4h
  zone_wait:
    description:
      - Seconds to wait for a queued resource to become ACTIVE in one zone before deleting the request
        and trying the next zone.
      - The request's C(validUntilDuration) is O(zone_wait) + O(operation_timeout) + 60 seconds, so a
        request the module gave up on (and failed to delete) does not turn into a node later, while
        the service, whose clock starts at the create, does not expire it before the module stops
        waiting.
    type: int
    default: 900
  network:
    description: VPC network name.
    type: str
    default: default
  external_ip:
    description: Give the node an external IP (SSH reaches it there).
    type: bool
    default: true
  labels:
    description: Labels set when the node is made.
    type: dict
    default: {}
  metadata:
    description: Metadata set when the node is made.
    type: dict
    default: {}
  ssh_keys:
    description: Lines C(user:ssh-ed25519 AAAA... comment) for metadata C(ssh-keys), set when the node is made.
    type: list
    elements: str
    default: []
  tags:
    description: Network tags set when the node is made.
    type: list
    elements: str
    default: []
  service_account:
    description:
      - Email of the service account the TPU VM runs as (C(node.serviceAccount.email)), set when the
        node is made.
      - Unset - the TPU API cannot make a TPU VM without a service account (an empty email means
        the project's Compute Engine default account, and an empty scope list means every Cloud
        API), so the node gets the default account limited to O(service_account_scopes), which by
        default reach no Cloud API.
    type: str
  service_account_scopes:
    description:
      - OAuth scopes of the node's service account. The default,
        C(https://www.googleapis.com/auth/userinfo.email), lets the VM learn its identity and call
        no Cloud API. An empty list is refused (the API reads it as every Cloud API).
    type: list
    elements: str
    default: [https://www.googleapis.com/auth/userinfo.email]
  known_hosts:
    description:
      - A known_hosts file on the controller to pin the TPU VM's SSH host keys in. The node is made
        with metadata C(enable-guest-attributes=TRUE); once it is READY the module waits (at most
        O(host_keys_timeout)) for the host keys worker 0 publishes as guest attributes
        (C(nodes.getGuestAttributes), query path C(hostkeys/)) and writes them (mode 0600) under
        the alias RV(host_key_alias), which names the node by project, zone, name and id.
      - Keys already pinned for the same alias that differ from the published ones fail the run.
        Written in check mode too (a later command's read-only lookup needs the pin).
    type: path
  host_keys_timeout:
    description: Seconds to wait for the node to publish its host keys (above 0).
    type: int
    default: 300
  operation_timeout:
    description: Seconds to wait for each operation and for an ACTIVE queued resource's node to be READY.
    type: int
    default: 600
  poll_interval:
    description: Seconds between reads while waiting.
    type: float
    default: 10
  retry_deadline:
    description: Seconds within which HTTP 429 (throttling, not quota) and 5xx answers are retried.
    type: float
    default: 120
  retry_initial_delay:
    description: First backoff delay in seconds (doubled each retry, at most 30).
    type: float
    default: 1.0
notes:
  - Diff mode shows zone, accelerator type, runtime, provisioning model and state.
  - A TPU VM has no separate boot disk to keep - the runtime image's disk goes with the node.
seealso:
  - name: gemma-rig docs/tpu.md
    description: Quotas, zones, prices, flex-start, and what was proven without a chip.
    link: https://cloud.google.com/tpu/docs/queued-resources
"""

EXAMPLES = r"""
- name: One v5e chip, flex-start for 4 hours, in the zone that offers it
  tpu_node:
    project: my-project
    zones: [us-west4-a]
    name: gemma-tpu-1
    provisioning_model: flex-start
    max_run_duration: 4h
    ssh_keys: ["rig:{{ lookup('ansible.builtin.file', '~/.ssh/id_ed25519.pub') }}"]
  register: tpu

- name: Spot chip, trying two zones
  tpu_node:
    project: my-project
    zones: [us-west4-a, us-east1-c]
    name: gemma-tpu-spot
    provisioning_model: spot

- name: Delete it and report what still bills
  tpu_node:
    project: my-project
    zones: [us-west4-a, us-east1-c]
    name: gemma-tpu-1
    state: absent
"""

RETURN = r"""
name:
  description: Name of the queued resource and node.
  returned: always
  type: str
zone:
  description: Zone of the node (or the first zone to try, in check mode); empty when absent.
  returned: always
  type: str
state:
  description: The node's state (READY, CREATING...), C(ABSENT), or C(PLANNED) in check mode.
  returned: always
  type: str
queued_resource_state:
  description: The queued resource's state (ACTIVE, WAITING_FOR_RESOURCES, SUSPENDED...), or C(ABSENT).
  returned: always
  type: str
provisioning_model:
  description: The provisioning model of the node now (or asked for, when there is none).
  returned: always
  type: str
accelerator_type:
  description: Accelerator type of the node.
  returned: when the node exists
  type: str
runtime_version:
  description: Runtime version of the node.
  returned: when the node exists
  type: str
external_ip:
  description: The node's external IP (C(networkEndpoints[0].accessConfig.externalIp)), the address for SSH.
  returned: always
  type: str
internal_ip:
  description: The node's internal IP.
  returned: always
  type: str
actions:
  description: What the module did (or would do in check mode), in order.
  returned: always
  type: list
  elements: str
zones_tried:
  description: Zones a request was made in, with the outcome (created, stockout, unsupported, quota...) and the API's reason.
  returned: always
  type: list
  elements: dict
recreated_because:
  description: Why an existing node or queued resource was replaced (flex-start ran out, preempted...); empty otherwise.
  returned: always
  type: str
still_costs:
  description: With O(state=absent), what is left after the run that bills (a node, an ACTIVE queued resource); empty when nothing does.
  returned: always
  type: list
  elements: str
left:
  description: With O(state=absent), everything of that name still found (billing or not).
  returned: always
  type: list
  elements: str
id:
  description: The node's id (a node made again under the same name has another).
  returned: when the node exists
  type: str
host_key_alias:
  description: The HostKeyAlias the node's host keys are pinned under (C(tpu/PROJECT/ZONE/NAME/ID)).
  returned: when O(known_hosts) is set and the node is READY
  type: str
host_keys:
  description: The node's SSH host keys as read from its guest attributes (C(TYPE BASE64)).
  returned: when O(known_hosts) is set and the node is READY
  type: list
  elements: str
ssh_common_args:
  description: ssh options that accept exactly the pinned keys (UserKnownHostsFile, StrictHostKeyChecking=yes, HostKeyAlias).
  returned: when O(known_hosts) is set and the node is READY
  type: str
error_kind:
  description: On failure - invalid, auth, quota, stockout, differs, timeout, hostkeys, operation, throttled or api.
  returned: on failure
  type: str
quota:
  description: The exhausted quota as the console spells it.
  returned: on a quota failure
  type: str
"""

import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.gce_client import cloud_module
from ansible.module_utils.gce_errors import GceError
from ansible.module_utils.tpu_api import (
    HAS_TPU,
    NODE_COMING,
    NODE_GONE,
    QR_API,
    QR_DELETING,
    QR_TERMINAL,
    QR_WAITING,
    TPU_IMPORT_ERROR,
    Api,
    create_error,
    duration_seconds,
    failed_error,
    make_api,
    quota_for,
    status_error,
)
from ansible.module_utils.vm_host_keys import alias, pin, ssh_common_args, wait_for_keys

ARGUMENT_SPEC: dict[str, Any] = dict(
    zones={"type": "list", "elements": "str", "required": True},
    name={"type": "str", "required": True},
    state={"type": "str", "default": "present", "choices": ["present", "absent"]},
    accelerator_type={"type": "str", "default": "v5litepod-1"},
    runtime_version={"type": "str", "default": "v2-alpha-tpuv5-lite"},
    provisioning_model={
        "type": "str",
        "default": "on-demand",
        "choices": ["flex-start", "spot", "on-demand"],
    },
    max_run_duration={"type": "str", "default": "4h"},
    zone_wait={"type": "int", "default": 900},
    network={"type": "str", "default": "default"},
    external_ip={"type": "bool", "default": True},
    labels={"type": "dict", "default": {}},
    metadata={"type": "dict", "default": {}},
    ssh_keys={"type": "list", "elements": "str", "default": [], "no_log": False},
    tags={"type": "list", "elements": "str", "default": []},
    service_account={"type": "str"},
    service_account_scopes={
        "type": "list",
        "elements": "str",
        "default": ["https://www.googleapis.com/auth/userinfo.email"],
    },
    known_hosts={"type": "path"},
    host_keys_timeout={"type": "int", "default": 300},
    operation_timeout={"type": "int", "default": 600},
    poll_interval={"type": "float", "default": 10},
    retry_deadline={"type": "float", "default": 120},
    retry_initial_delay={"type": "float", "default": 1.0},
)
MAX_FLEX_SECONDS = 7 * 86400  # flex-start runs at most 7 days
LIFETIME_SLACK = 60  # seconds a request outlives the module's own waits (request_lifetime)


def _last(value: str | None) -> str:
    return (value or "").rstrip("/").rsplit("/", 1)[-1]


def node_body(p: dict[str, Any]) -> dict[str, Any]:
    """The node inside the queued resource (REST JSON, as the API reference names the fields)."""
    metadata = {str(k): str(v) for k, v in p["metadata"].items()}
    if p["ssh_keys"]:
        metadata["ssh-keys"] = "\n".join(p["ssh_keys"])
    if p["known_hosts"]:
        # Worker 0 publishes its SSH host keys as guest attributes (hostkeys/) when this is TRUE.
        metadata["enable-guest-attributes"] = "TRUE"
    # Always sent: left out, the API gives the VM the default account with every Cloud API.
    account: dict[str, Any] = {"scope": list(p["service_account_scopes"])}
    if p["service_account"]:
        account["email"] = p["service_account"]
    node: dict[str, Any] = {
        "acceleratorType": p["accelerator_type"],
        "runtimeVersion": p["runtime_version"],
        "networkConfig": {"network": p["network"], "enableExternalIps": p["external_ip"]},
        "serviceAccount": account,
    }
    if p["labels"]:
        node["labels"] = {str(k): str(v) for k, v in p["labels"].items()}
    if metadata:
        node["metadata"] = metadata
    if p["tags"]:
        node["tags"] = list(p["tags"])
    if p["provisioning_model"] == "spot":
        node["schedulingConfig"] = {"spot": True}
    return node


def request_lifetime(p: dict[str, Any]) -> int:
    """Seconds the service keeps the request waiting (``validUntilDuration``).

    A request the module gave up on (zone_wait) must not turn into a billed node later, so it
    expires; but the service counts from the create, and the module starts its zone_wait only once
    the create operation is done (up to operation_timeout later). A lifetime of just zone_wait would
    expire first and turn a slow zone into a FAILED request, so it is both, plus a minute of slack.
    """
    return int(p["zone_wait"]) + int(p["operation_timeout"]) + LIFETIME_SLACK


def qr_body(p: dict[str, Any], project: str, zone: str) -> dict[str, Any]:
    """The queued resource to create in ``zone``.

    Flex-start is the two v2alpha1 fields below (what ``gcloud alpha compute tpus queued-resources
    create --provisioning-model=flex-start --max-run-duration=4h`` asks for); neither the released
    client nor the v2 surface has them. docs/tpu.md says what of this was proven without a chip.
    """
    body: dict[str, Any] = {
        "tpu": {
            "nodeSpec": [
                {"parent": f"projects/{project}/locations/{zone}", "nodeId": p["name"], "node": node_body(p)}
            ]
        },
        "queueingPolicy": {"validUntilDuration": f"{request_lifetime(p)}s"},
    }
    if p["provisioning_model"] == "spot":
        body["spot"] = {}
    elif p["provisioning_model"] == "flex-start":
        body["provisioningModel"] = "FLEX_START"
        body["runDuration"] = {"maxRunDuration": f"{duration_seconds(p['max_run_duration'])}s"}
    return body


def model_of(qr: dict[str, Any] | None, node: dict[str, Any] | None) -> str:
    """The provisioning model an existing request or node has."""
    if qr:
        if qr.get("provisioningModel") == "FLEX_START":
            return "flex-start"
        if "spot" in qr:
            return "spot"
        return "on-demand"
    sched = (node or {}).get("schedulingConfig") or {}
    return "spot" if sched.get("spot") or sched.get("preemptible") else "on-demand"


def ips(node: dict[str, Any] | None) -> tuple[str, str]:
    """External and internal IP of a node (the first network endpoint)."""
    endpoint = ((node or {}).get("networkEndpoints") or [{}])[0]
    return (endpoint.get("accessConfig") or {}).get("externalIp", ""), endpoint.get("ipAddress", "")


def view(
    zone: str, qr: dict[str, Any] | None, node: dict[str, Any] | None, p: dict[str, Any]
) -> dict[str, Any]:
    """What the module returns about the node and its request."""
    external, internal = ips(node)
    out = {
        "zone": zone,
        "state": (node or {}).get("state", "ABSENT") if node else "ABSENT",
        "queued_resource_state": ((qr or {}).get("state") or {}).get("state", "ABSENT") if qr else "ABSENT",
        "provisioning_model": model_of(qr, node) if (qr or node) else p["provisioning_model"],
        "external_ip": external,
        "internal_ip": internal,
    }
    if node:
        out.update(
            accelerator_type=node.get("acceleratorType", ""),
            runtime_version=node.get("runtimeVersion", ""),
            id=str(node.get("id", "")),
        )
    return out


def diff_view(v: dict[str, Any]) -> dict[str, Any]:
    if v["state"] == "ABSENT" and v["queued_resource_state"] == "ABSENT":
        return {}
    keys = ("zone", "accelerator_type", "runtime_version", "provisioning_model", "state")
    return {k: v[k] for k in keys if k in v}


class Runner:
    """One run's reads and writes, with what it did so far (reported on failure too)."""

    def __init__(self, module: AnsibleModule, api: Api) -> None:
        self.module = module
        self.p = module.params
        self.api = api
        self.actions: list[str] = []
        self.zones_tried: list[dict[str, str]] = []
        self.warnings: list[str] = []
        self.changed = False

    def find(self) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
        """The first zone holding a queued resource or node of this name, with both (or "", None, None)."""
        for zone in self.p["zones"]:
            qr = self.api.get_qr(zone, self.p["name"])
            node = self.api.get_node(zone, self.p["name"])
            if qr or node:
                return zone, qr, node
        return "", None, None

    def remove(self, zone: str, qr: dict[str, Any] | None, node: dict[str, Any] | None) -> None:
        """Delete the queued resource (force: its node too) and a node of the name without one."""
        qr_state = ((qr or {}).get("state") or {}).get("state", "")
        if qr and qr_state == QR_DELETING:
            # Someone else's delete is under way: asking again would be refused; wait it out.
            self.actions.append(f"wait for queued resource {self.p['name']} in {zone} (DELETING)")
            self.wait_gone(zone)
            qr = None
        if qr:
            self.changed = True
            self.api.delete_qr(zone, self.p["name"])
            self.actions.append(f"delete queued resource {self.p['name']} in {zone}")
        if node and self.api.get_node(zone, self.p["name"]):  # not gone with its queued resource
            self.changed = True
            self.api.delete_node(zone, self.p["name"])
            self.actions.append(f"delete node {self.p['name']} in {zone}")

    def wait_gone(self, zone: str) -> None:
        """Wait (at most operation_timeout) until the queued resource of this name is gone."""
        deadline = time.monotonic() + self.api.operation_timeout
        while self.api.get_qr(zone, self.p["name"]) is not None:
            if time.monotonic() >= deadline:
                raise GceError(
                    "timeout",
                    f"queued resource {self.p['name']} in {zone} was still DELETING after operation_timeout",
                )
            time.sleep(self.api.poll_interval)

    def wait_active(self, zone: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None, GceError | None]:
        """Wait for the queued resource to be ACTIVE and its node READY.

        Returns (qr, node, None) when it is, or (qr, None, error) when the zone gave up: the request
        FAILED, or was still waiting after zone_wait.
        """
        name, fallback = self.p["name"], quota_for(self.p["provisioning_model"])
        deadline = time.monotonic() + self.p["zone_wait"]
        while True:
            qr = self.api.get_qr(zone, name)
            state = ((qr or {}).get("state") or {}).get("state", "")
            if qr is None:
                return None, None, GceError("operation", f"queued resource {name} vanished in {zone}")
            if state == "ACTIVE":
                break
            if state in QR_TERMINAL:
                return qr, None, failed_error(qr, self.api, zone, fallback)
            if state == QR_DELETING:
                return qr, None, GceError("operation", f"queued resource {name} in {zone} is being deleted")
            if state not in QR_WAITING:  # STATE_UNSPECIFIED, or one newer than this module
                return (
                    qr,
                    None,
                    GceError("operation", f"queued resource {name} in {zone} is {state or 'stateless'}"),
                )
            if time.monotonic() >= deadline:
                return (
                    qr,
                    None,
                    GceError(
                        "stockout",
                        f"still {state} after zone_wait={self.p['zone_wait']}s (no capacity or no quota yet)",
                        "WAITING_FOR_RESOURCES",
                    ),
                )
            time.sleep(self.api.poll_interval)
        node_deadline = time.monotonic() + self.api.operation_timeout
        while True:
            node = self.api.get_node(zone, name)
            state = (node or {}).get("state", "")
            if state == "READY":
                return qr, node, None
            if node and state not in NODE_COMING:  # gone, stopped, hidden or UNKNOWN: no use waiting
                raise GceError(
                    "operation",
                    f"node {name} in {zone} is {state}, and will not become READY by waiting: "
                    "see it in the console, or delete it (state=absent) and run again",
                )
            if time.monotonic() >= node_deadline:
                state = (node or {}).get("state", "ABSENT")
                raise GceError(
                    "timeout", f"node {name} in {zone} was {state}, not READY, after operation_timeout"
                )
            time.sleep(self.api.poll_interval)

    def create(self) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """Ask each zone in order; returns (zone, qr, node) of the first that gives a READY node."""
        name, fallback = self.p["name"], quota_for(self.p["provisioning_model"])
        for zone in self.p["zones"]:
            try:
                op = self.api.create_qr(zone, name, qr_body(self.p, self.api.project, zone))
            except Exception as exc:
                err = create_error(exc, self.api, zone, fallback)
                self.zones_tried.append({"zone": zone, "result": err.kind, "reason": str(err)})
                if err.kind not in ("stockout", "unsupported"):
                    raise err from exc
                self.actions.append(f"{err.kind} in {zone}")
                self.warnings.append(f"zone {zone}: {err}; trying the next zone")
                continue
            self.changed = True
            self.actions.append(f"create queued resource {name} in {zone}")
            op_error = self.api.wait(op["name"], QR_API)
            if op_error:  # the create itself failed; what it left behind is deleted below
                qr, node = None, None
                err = status_error(op_error, f"creating {name} in {zone} failed", self.api, zone, fallback)
            else:
                qr, node, err = self.wait_active(zone)
            if err is None and qr and node:
                self.zones_tried.append({"zone": zone, "result": "created", "reason": ""})
                return zone, qr, node
            assert err is not None
            self.zones_tried.append({"zone": zone, "result": err.kind, "reason": str(err)})
            self.api.delete_qr(zone, name)  # a failed or abandoned request: nothing left behind
            self.actions.append(f"delete queued resource {name} in {zone} ({err.kind})")
            if err.kind not in ("stockout", "unsupported"):
                raise err
            why = "has no capacity" if err.kind == "stockout" else "does not offer this"
            self.warnings.append(f"zone {zone} {why} ({err}); trying the next zone")
        raise GceError(
            "stockout",
            f"no {self.p['provisioning_model']} {self.p['accelerator_type']} in any of {', '.join(self.p['zones'])}; "
            "add zones or retry later. " + "; ".join(f"{z['zone']}: {z['reason']}" for z in self.zones_tried),
            "RESOURCE_EXHAUSTED",
        )

    def leftovers(self) -> tuple[list[str], list[str]]:
        """Everything of this name still found in the zones, and the part of it that bills."""
        left, costs = [], []
        for zone in self.p["zones"]:
            qr = self.api.get_qr(zone, self.p["name"])
            node = self.api.get_node(zone, self.p["name"])
            if qr:
                state = (qr.get("state") or {}).get("state", "")
                left.append(f"queued resource {self.p['name']} in {zone} ({state})")
                if state == "ACTIVE":
                    costs.append(f"queued resource {self.p['name']} in {zone} holds a chip (ACTIVE)")
            if node:
                left.append(f"node {self.p['name']} in {zone} ({node.get('state')})")
                costs.append(
                    f"node {self.p['name']} in {zone} ({node.get('state')}): the chip and its boot disk"
                )
        return left, costs


def why_over(qr: dict[str, Any] | None, node: dict[str, Any] | None, p: dict[str, Any]) -> str:
    """Why an existing request or node must be replaced; empty when it still serves (or is on its way)."""
    qr_state = ((qr or {}).get("state") or {}).get("state", "") if qr else ""
    model = model_of(qr, node)
    if qr_state in QR_TERMINAL:
        detail = ((qr or {}).get("state") or {}).get("failedData", {}).get("error", {}).get("message", "")
        if model == "flex-start" and qr_state != "FAILED":
            return f"queued resource is {qr_state}: flex-start ran its max_run_duration and the service deleted the node"
        return f"queued resource is {qr_state}" + (f" ({detail})" if detail else "")
    if qr_state == QR_DELETING:
        return "queued resource is DELETING (deleted by someone else)"
    if qr_state == "ACTIVE" and node is None:
        return "queued resource is ACTIVE but its node is gone" + (
            " (flex-start ran out)" if model == "flex-start" else ""
        )
    if node and node.get("state") in NODE_GONE:
        return f"node is {node.get('state')}" + (" (spot preemption)" if model == "spot" else "")
    return ""


def differences(qr: dict[str, Any] | None, node: dict[str, Any] | None, p: dict[str, Any]) -> list[str]:
    """Fields of an existing node that differ from the request (none of them can change in place)."""
    out = []
    spec = (((qr or {}).get("tpu") or {}).get("nodeSpec") or [{}])[0].get("node") or {}
    have = {
        "accelerator_type": (node or {}).get("acceleratorType") or spec.get("acceleratorType", ""),
        "runtime_version": (node or {}).get("runtimeVersion") or spec.get("runtimeVersion", ""),
        "provisioning_model": model_of(qr, node),
    }
    for key, value in have.items():
        if value and value != p[key]:
            out.append(f"{key} is {value}, asked {p[key]}")
    return out


def run(module: AnsibleModule, r: Runner) -> dict[str, Any]:
    p = module.params
    check = module.check_mode
    zone, qr, node = r.find()
    before = view(zone, qr, node, p) if zone else view("", None, None, p)
    result: dict[str, Any] = {"name": p["name"], "recreated_because": "", "still_costs": [], "left": []}

    if p["state"] == "absent":
        if zone:
            if check:
                r.changed = True
                r.actions.append(f"delete queued resource and node {p['name']} in {zone}")
            else:
                r.remove(zone, qr, node)
        result.update(view("", None, None, p))
        if not check:
            result["left"], result["still_costs"] = r.leftovers()
        result["diff"] = {"before": diff_view(before), "after": {}}
    else:
        reason = why_over(qr, node, p) if zone else ""
        if zone and not reason:
            problems = differences(qr, node, p)
            if problems:
                raise GceError(
                    "differs",
                    f"TPU node {p['name']} in {zone}: {'; '.join(problems)}, which a TPU VM cannot change: "
                    "delete it (state=absent) and run again",
                )
        if zone and not reason:
            qr_state = ((qr or {}).get("state") or {}).get("state", "")
            if not check and (qr_state in QR_WAITING or (node or {}).get("state") != "READY"):
                r.actions.append(f"wait for {p['name']} in {zone} ({qr_state or node.get('state')})")
                qr, node, err = r.wait_active(zone)
                if err:
                    raise err
            after = view(zone, qr, node, p)
        else:
            if reason:
                result["recreated_because"] = f"{p['name']} in {zone}: {reason}"
                r.warnings.append(f"recreating {result['recreated_because']}")
            if check:
                r.changed = True
                if zone:
                    r.actions.append(f"delete queued resource {p['name']} in {zone} ({reason})")
                r.actions.append(
                    f"create queued resource {p['name']} in {p['zones'][0]} (first zone with capacity)"
                )
                after = dict(
                    view(p["zones"][0], None, None, p), state="PLANNED", queued_resource_state="PLANNED"
                )
                after.update(accelerator_type=p["accelerator_type"], runtime_version=p["runtime_version"])
                result["body"] = qr_body(p, r.api.project, p["zones"][0])
            else:
                if zone:
                    r.remove(zone, qr, node)
                zone, qr, node = r.create()
                after = view(zone, qr, node, p)
        result.update(after)
        result["diff"] = {"before": diff_view(before), "after": diff_view(after)}
        replaced_in_check = check and bool(result["recreated_because"])
        if p["known_hosts"] and node and node.get("state") == "READY" and not replaced_in_check:
            result.update(host_keys(module, r, zone, node))
    result.update(changed=r.changed, actions=r.actions, zones_tried=r.zones_tried)
    for warning in r.warnings:
        module.warn(warning)
    return result


def host_keys(module: AnsibleModule, r: Runner, zone: str, node: dict[str, Any]) -> dict[str, Any]:
    """Wait for the READY node's published host keys and pin them; what the result adds."""
    p = module.params
    node_id = str(node.get("id", ""))
    vm = f"TPU VM {p['name']} (project {r.api.project}, zone {zone}, id {node_id})"
    key_alias = alias("tpu", r.api.project, zone, p["name"], node_id)
    poll = min(r.api.poll_interval, max(0.05, p["host_keys_timeout"] / 20))
    keys = wait_for_keys(lambda: r.api.guest_hostkeys(zone, p["name"]), vm, p["host_keys_timeout"], poll)
    if pin(p["known_hosts"], key_alias, keys, vm):
        r.actions.append(f"pin SSH host keys of {p['name']} in {p['known_hosts']}")
        r.changed = r.changed or not module.check_mode
    return {
        "host_key_alias": key_alias,
        "host_keys": keys,
        "ssh_common_args": ssh_common_args(p["known_hosts"], key_alias),
    }


def check_params(p: dict[str, Any]) -> str:
    """A one-line problem with the parameters, found before any request; empty when none."""
    if not p["zones"]:
        return "zones must name at least one zone"
    if not p["service_account_scopes"]:
        return "service_account_scopes must name at least one scope (the API reads none as every Cloud API)"
    for key in (
        "zone_wait",
        "operation_timeout",
        "poll_interval",
        "retry_deadline",
        "retry_initial_delay",
        "host_keys_timeout",
    ):
        if p[key] <= 0:
            return f"{key} must be above 0, got {p[key]}"
    if p["provisioning_model"] == "flex-start":
        try:
            seconds = duration_seconds(p["max_run_duration"])
        except ValueError as err:
            return str(err)
        if not 0 < seconds <= MAX_FLEX_SECONDS:
            return f"max_run_duration {p['max_run_duration']} must be above 0 and at most 7 days (flex-start's limit)"
    return ""


def main() -> None:
    module = cloud_module(ARGUMENT_SPEC)
    if not HAS_TPU:
        module.fail_json(msg=missing_required_lib("google-cloud-tpu"), exception=str(TPU_IMPORT_ERROR))
    problem = check_params(module.params)  # before any request, credentials included
    if problem:
        module.fail_json(msg=problem, error_kind="invalid")
    try:
        r = Runner(module, make_api(module.params))
    except ValueError as err:  # credentials: raised before any request
        module.fail_json(msg=str(err), error_kind="auth")
    try:
        result = run(module, r)
    except GceError as err:
        for warning in r.warnings:
            module.warn(warning)
        msg = str(err)
        if r.changed:
            msg += f" (already done: {', '.join(r.actions)})"
        module.fail_json(
            msg=msg,
            changed=r.changed,
            name=module.params["name"],
            actions=r.actions,
            zones_tried=r.zones_tried,
            error_kind=err.kind,
            quota=err.quota,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
