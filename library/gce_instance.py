#!/usr/bin/python
"""Ansible module: one Compute Engine VM (T4 by default) with zone fallback, check mode and diff."""

# ruff: noqa: E402 - Ansible modules keep DOCUMENTATION/EXAMPLES/RETURN above the imports.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gce_instance
short_description: Create, update, start, stop or delete one Compute Engine VM, trying zones in order
description:
  - Manages one Compute Engine instance with the google-cloud-compute client, shaped by default for
    the gemma-rig T4 host (n1-standard-2, one nvidia-tesla-t4, Debian 13, 32 GB pd-ssd boot disk,
    250 GB pd-balanced data disk that survives the VM).
  - Looks for the instance in every zone of O(zones) first, so it is never created twice.
  - When a zone has no capacity (C(ZONE_RESOURCE_POOL_EXHAUSTED) and its relatives) it tries the
    next zone and says so in a warning and in RV(zones_tried). A quota error fails at once, naming
    the quota and how to raise it. HTTP 429 and 5xx answers are retried with exponential backoff;
    inserts carry a requestId so a retried insert never makes a second VM.
  - Compares only what was asked for. Fields the API fills in (the NIC's subnetwork, networkIP,
    fingerprints, disk URLs, interfaces and device names, scheduling defaults, cpuPlatform...) are
    never compared, an option left unset is never a difference, and labels, metadata keys and
    C(ssh-keys) lines that others added (the console, C(gcloud compute ssh), Google's C(goog-)
    labels) are kept.
  - Labels, metadata and tags are changed in place. Machine type, GPU, scheduling and service
    account need the VM stopped; they are reported in the diff and the module fails unless
    O(allow_stop=true). Network, subnetwork, external IP and data disk changes would need a new
    VM; the module reports them and fails.
  - Disk sizes and the GPU count are checked before any request (T4 - 1, 2 or 4 per N1 VM, within
    the vCPU and memory the count allows); a bad value fails with a one-line message naming the
    option.
  - Every changing request carries a requestId, so a request whose reply was lost (HTTP 503 after
    the work was done, or a dropped connection) is sent again without doing the work twice.
  - A run that fails midway says what it already did (RV(changed), RV(actions)) and the VM's
    state now (RV(status), RV(machine_type)...).
version_added: "0.1.0"
author: gemma-rig contributors !UNKNOWN
requirements:
  - google-cloud-compute >= 1.56
extends_documentation_fragment: [google_cloud]
options:
  zones:
    description:
      - Zones to try, in order. The first with capacity gets the VM. One zone may be given as a string.
      - When the data disk already exists, only its zone is used (a disk attaches only in its zone).
    type: list
    elements: str
    required: true
  name:
    description: Instance name (also the boot disk's name).
    type: str
    required: true
  state:
    description:
      - V(present) makes sure the VM exists (a new one is started), V(started) and V(stopped) also
        set its power state, V(absent) deletes it (the data disk is kept unless O(delete_data_disk)).
    type: str
    choices: [present, started, stopped, absent]
    default: present
  machine_type:
    description: Machine type.
    type: str
    default: n1-standard-2
  accelerator_type:
    description: GPU type.
    type: str
    default: nvidia-tesla-t4
  accelerator_count:
    description:
      - Number of GPUs; V(0) for none. A GPU VM gets C(onHostMaintenance=TERMINATE).
      - For C(nvidia-tesla-t4) on N1 - 1 or 2 with at most 48 vCPUs and 312 GB, 4 with at most 96 vCPUs
        and 624 GB; other counts, other machine families and the shared-core types are refused
        before any request.
    type: int
    default: 1
  image:
    description: Boot image, by O(image.family) (preferred) or O(image.name).
    type: dict
    default: {project: debian-cloud, family: debian-13}
    suboptions:
      project:
        description: Project holding the image.
        type: str
        default: debian-cloud
      family:
        description: Image family; the newest image of it is used.
        type: str
      name:
        description: Exact image name, when no family is given.
        type: str
  boot_disk:
    description: Boot disk, created with the VM. Only used at creation.
    type: dict
    default: {}
    suboptions:
      size_gb:
        description: Size in GB, 10 to 65536.
        type: int
        default: 32
      type:
        description: Disk type.
        type: str
        default: pd-ssd
      auto_delete:
        description: Delete the boot disk with the VM (set explicitly, since the API defaults to false).
        type: bool
        default: true
  data_disk:
    description:
      - The data disk (models, caches, swap). Reused by name when a disk of that name exists in one
        of O(zones); else created with the VM, in the same zone.
      - Its device name is always O(name) + C(-data), so the VM sees it as
        C(/dev/disk/by-id/google-NAME-data) whatever the disk is called.
    type: dict
    default: {}
    suboptions:
      enabled:
        description: Attach a data disk at all.
        type: bool
        default: true
      name:
        description: Disk name; defaults to O(name) + C(-data).
        type: str
      size_gb:
        description: Size in GB when created, 10 to 65536.
        type: int
        default: 250
      type:
        description: Disk type when created.
        type: str
        default: pd-balanced
      auto_delete:
        description: Delete the data disk with the VM. Off, so models survive a teardown.
        type: bool
        default: false
  delete_data_disk:
    description: With O(state=absent), delete the data disk too (it holds the models and caches).
    type: bool
    default: false
  provisioning_model:
    description: V(standard), or V(spot) (cheaper, may be preempted; counts against PREEMPTIBLE_NVIDIA_T4_GPUS).
    type: str
    choices: [standard, spot]
    default: standard
  termination_action:
    description: What a spot VM does when preempted.
    type: str
    choices: [stop, delete]
    default: stop
  labels:
    description: Labels to set. Labels on the VM that are not named here are kept.
    type: dict
    default: {}
  metadata:
    description:
      - Free-form instance metadata to set, together with the options below. Keys on the VM that are
        not named here are kept.
    type: dict
    default: {}
  startup_script:
    description: Startup script (metadata key C(startup-script)).
    type: str
  ssh_keys:
    description:
      - Lines C(user:ssh-ed25519 AAAA... comment) (metadata key C(ssh-keys)). Missing lines are
        added; lines others added (the console's, C(gcloud compute ssh)'s) are kept.
    type: list
    elements: str
  os_login:
    description: Set metadata C(enable-oslogin) to TRUE or FALSE; unset leaves it out.
    type: bool
  service_account:
    description:
      - Service account email the VM runs as (V(default) for the project's Compute Engine default
        account, which the API stores by its email). Unset - none at creation, and whatever account
        the VM has is left alone.
    type: str
  scopes:
    description: OAuth scopes for O(service_account); compared (as a set) only when O(service_account) is set.
    type: list
    elements: str
    default: [https://www.googleapis.com/auth/cloud-platform]
  known_hosts:
    description:
      - A known_hosts file on the controller to pin the VM's SSH host keys in. When set, the VM is
        made with metadata C(enable-guest-attributes=TRUE), and once it runs the module waits (at
        most O(host_keys_timeout)) for the keys its guest environment publishes as guest attributes
        (C(instances.getGuestAttributes), query path C(hostkeys/)), reads them over the API and
        writes them (mode 0600) under the alias RV(host_key_alias), which names the VM by project,
        zone, name and id. RV(ssh_common_args) makes SSH accept exactly those keys.
      - Keys already pinned for the same alias that differ from the published ones fail the run.
      - Written in check mode too (a later command's read-only lookup needs the pin); it counts as a
        change only outside check mode.
    type: path
  host_keys_timeout:
    description: Seconds to wait for the VM to publish its host keys (above 0).
    type: int
    default: 300
  network:
    description: VPC network name.
    type: str
    default: default
  subnetwork:
    description:
      - Subnetwork name in the zone's region (needed on custom-mode networks). Unset - the API picks
        the network's subnetwork for the region, and it is not compared.
    type: str
  tags:
    description: Network tags (firewall rules select VMs by them), managed as a whole; unset - not compared.
    type: list
    elements: str
  external_ip:
    description: Give the VM an ephemeral external IP.
    type: bool
    default: true
  allow_stop:
    description: Allow stop, update, start to apply changes that need a stopped VM.
    type: bool
    default: false
  operation_timeout:
    description: Seconds to wait for each operation (above 0). On a timeout the error names the VM's state.
    type: int
    default: 600
  retry_deadline:
    description:
      - Seconds within which 429 and 5xx answers and dropped connections are retried (above 0).
        Throttling until the deadline fails with RV(error_kind=throttled).
    type: float
    default: 120
  retry_initial_delay:
    description: First backoff delay in seconds (doubled each retry, at most 30).
    type: float
    default: 1.0
notes:
  - Needs the Compute Engine API enabled and a GPU quota above 0 in the zones' regions.
seealso:
  - name: gemma-rig docs/gce.md
    description: Quota, zones, costs, tunnels and opening the endpoint.
    link: https://cloud.google.com/compute/docs/gpus
"""

EXAMPLES = r"""
- name: T4 rig VM, trying three zones
  gce_instance:
    project: my-project
    zones: [us-central1-a, us-central1-b, us-east1-c]
    name: gemma-rig-1
    labels: {app: gemma-rig}
    ssh_keys: ["rig:{{ lookup('ansible.builtin.file', '~/.ssh/id_ed25519.pub') }}"]
  register: vm

- name: Spot VM that stops when preempted
  gce_instance:
    project: my-project
    zones: us-west1-b
    name: gemma-rig-spot
    provisioning_model: spot
    termination_action: stop

- name: Bigger machine, allowing the stop/update/start it needs
  gce_instance:
    project: my-project
    zones: [us-central1-a]
    name: gemma-rig-1
    machine_type: n1-standard-4
    allow_stop: true

- name: Delete the VM, keep the data disk
  gce_instance:
    project: my-project
    zones: [us-central1-a, us-central1-b]
    name: gemma-rig-1
    state: absent
"""

RETURN = r"""
name:
  description: Instance name.
  returned: always
  type: str
zone:
  description: Zone the instance is in (or would be created in, in check mode); empty when absent.
  returned: always
  type: str
status:
  description:
    - Instance status (RUNNING, TERMINATED, STOPPING...), C(ABSENT), or C(PLANNED) in check mode.
    - On failure, the VM's status as read after the failure (C(UNKNOWN) if it could not be read).
  returned: always
  type: str
machine_type:
  description: The VM's machine type now.
  returned: when the instance exists
  type: str
accelerators:
  description: The VM's GPUs now.
  returned: when the instance exists
  type: list
  elements: dict
  contains:
    type: {description: Accelerator type., type: str}
    count: {description: Number of them., type: int}
internal_ip:
  description: Primary internal IP.
  returned: when the instance exists
  type: str
external_ip:
  description: Ephemeral external IP, empty when none.
  returned: when the instance exists
  type: str
disks:
  description: Attached disks.
  returned: when the instance exists
  type: list
  elements: dict
  contains:
    name: {description: Disk name., type: str}
    boot: {description: Boot disk or not., type: bool}
    auto_delete: {description: Deleted with the VM., type: bool}
    device_name: {description: Device name (/dev/disk/by-id/google-NAME)., type: str}
    size_gb: {description: Size in GB., type: int}
actions:
  description: What the module did (or would do in check mode), in order; on failure, what it did before failing.
  returned: always
  type: list
  elements: str
  sample: ["stockout in us-central1-a", "insert in us-central1-b"]
changed:
  description: Whether anything was changed; on failure, whether anything was changed before it.
  returned: always
  type: bool
zones_tried:
  description: Zones an insert was attempted in, with the outcome; also returned when every zone failed.
  returned: always
  type: list
  elements: dict
  contains:
    zone: {description: The zone., type: str}
    result: {description: "C(created), C(stockout), C(quota)...", type: str}
    reason: {description: The API's error code and message (empty when created)., type: str}
error_kind:
  description: >-
    On failure - C(invalid) (refused before any request), C(auth), C(stockout), C(quota),
    C(throttled), C(timeout), C(operation) (an operation's own error) or C(api).
  returned: on failure
  type: str
quota:
  description: The exhausted quota as the API spells it (C(NVIDIA_T4_GPUS), C(PREEMPTIBLE_NVIDIA_T4_GPUS)).
  returned: on a quota failure
  type: str
data_disk:
  description: The data disk as it stands after the run (name, zone, size_gb, type), or null when none exists.
  returned: always
  type: dict
id:
  description: The VM's numeric id (a recreated VM of the same name has another).
  returned: when the instance exists
  type: str
host_key_alias:
  description: The HostKeyAlias the VM's host keys are pinned under (C(gce/PROJECT/ZONE/NAME/ID)).
  returned: when O(known_hosts) is set and the VM is running
  type: str
host_keys:
  description: The VM's SSH host keys as read from its guest attributes (C(TYPE BASE64)).
  returned: when O(known_hosts) is set and the VM is running
  type: list
  elements: str
ssh_common_args:
  description: >-
    ssh options for the VM's connection - C(UserKnownHostsFile) (O(known_hosts)),
    C(StrictHostKeyChecking=yes) and C(HostKeyAlias).
  returned: when O(known_hosts) is set and the VM is running
  type: str
changes:
  description: Changed fields grouped as in_place, stop and recreate.
  returned: when the instance existed
  type: dict
"""

import contextlib
import json
import uuid
from typing import Any

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.gce_body import STOPPED, instance_body
from ansible.module_utils.gce_client import (
    HAS_GOOGLE,
    IMPORT_ERROR,
    cloud_module,
    make_clients,
    to_dict,
)
from ansible.module_utils.gce_diff import changes, diff_views, merged, summarize_existing, summarize_wanted
from ansible.module_utils.gce_errors import GceError, classify_exception, exception_to_error
from ansible.module_utils.gce_limits import check as check_numbers
from ansible.module_utils.gce_limits import gpu_problem
from ansible.module_utils.gce_operations import OPERATION_ERROR_KINDS, get_or_none, start, wait
from ansible.module_utils.gce_retry import make_retry
from ansible.module_utils.vm_host_keys import QUERY_PATH, alias, pin, ssh_common_args, wait_for_keys


def _last(value: str | None) -> str:
    return (value or "").rstrip("/").rsplit("/", 1)[-1]


ARGUMENT_SPEC: dict[str, Any] = dict(
    zones={"type": "list", "elements": "str", "required": True},
    name={"type": "str", "required": True},
    state={"type": "str", "default": "present", "choices": ["present", "started", "stopped", "absent"]},
    machine_type={"type": "str", "default": "n1-standard-2"},
    accelerator_type={"type": "str", "default": "nvidia-tesla-t4"},
    accelerator_count={"type": "int", "default": 1},
    image={
        "type": "dict",
        "default": {"project": "debian-cloud", "family": "debian-13"},
        "options": {
            "project": {"type": "str", "default": "debian-cloud"},
            "family": {"type": "str"},
            "name": {"type": "str"},
        },
        "required_one_of": [["family", "name"]],
    },
    boot_disk={
        "type": "dict",
        "default": {},
        "options": {
            "size_gb": {"type": "int", "default": 32},
            "type": {"type": "str", "default": "pd-ssd"},
            "auto_delete": {"type": "bool", "default": True},
        },
    },
    data_disk={
        "type": "dict",
        "default": {},
        "options": {
            "enabled": {"type": "bool", "default": True},
            "name": {"type": "str"},
            "size_gb": {"type": "int", "default": 250},
            "type": {"type": "str", "default": "pd-balanced"},
            "auto_delete": {"type": "bool", "default": False},
        },
    },
    delete_data_disk={"type": "bool", "default": False},
    provisioning_model={"type": "str", "default": "standard", "choices": ["standard", "spot"]},
    termination_action={"type": "str", "default": "stop", "choices": ["stop", "delete"]},
    labels={"type": "dict", "default": {}},
    metadata={"type": "dict", "default": {}},
    startup_script={"type": "str"},
    ssh_keys={"type": "list", "elements": "str", "no_log": False},
    os_login={"type": "bool"},
    service_account={"type": "str"},
    scopes={"type": "list", "elements": "str", "default": ["https://www.googleapis.com/auth/cloud-platform"]},
    known_hosts={"type": "path"},
    host_keys_timeout={"type": "int", "default": 300},
    network={"type": "str", "default": "default"},
    subnetwork={"type": "str"},
    tags={"type": "list", "elements": "str"},
    external_ip={"type": "bool", "default": True},
    allow_stop={"type": "bool", "default": False},
    operation_timeout={"type": "int", "default": 600},
    retry_deadline={"type": "float", "default": 120.0},
    retry_initial_delay={"type": "float", "default": 1.0},
)


class Runner:
    """One module run: fetch, compare, act; remembers what it changed so a failure can say so."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.project = self.p["project"]
        self.clients = make_clients(
            self.p["auth_kind"], self.p["service_account_file"], self.p["api_endpoint"]
        )
        self.retry = make_retry(self.p["retry_initial_delay"], 30.0, self.p["retry_deadline"])
        self.actions: list[str] = []
        self.warnings: list[str] = []
        self.zones_tried: list[dict[str, str]] = []
        self.changed = False

    # ---- reads ---------------------------------------------------------------------------------
    def _get(self, call: Any, **kwargs: Any) -> dict[str, Any] | None:
        return get_or_none(call, self.project, self.retry, **kwargs)

    def find_instance(self) -> dict[str, Any] | None:
        for zone in self.p["zones"]:
            inst = self._get(self.clients.instances.get, zone=zone, instance=self.p["name"])
            if inst:
                return inst
        return None

    def data_disk_name(self) -> str:
        return (self.p["data_disk"] or {}).get("name") or f"{self.p['name']}-data"

    def find_data_disk(self) -> dict[str, Any] | None:
        if not self.p["data_disk"]["enabled"] and not self.p["delete_data_disk"]:
            return None
        for zone in self.p["zones"]:
            disk = self._get(self.clients.disks.get, zone=zone, disk=self.data_disk_name())
            if disk:
                return disk
        return None

    def guest_hostkeys(self, zone: str) -> list[dict[str, Any]] | None:
        """The VM's ``hostkeys/`` guest attribute entries; None while it has published none (404)."""
        from google.cloud import compute_v1

        request = compute_v1.GetGuestAttributesInstanceRequest(
            project=self.project, zone=zone, instance=self.p["name"], query_path=QUERY_PATH
        )
        try:
            attrs = to_dict(self.clients.instances.get_guest_attributes(request=request, retry=self.retry))
        except Exception as exc:
            if classify_exception(exc) == "notfound":
                return None
            raise exception_to_error(exc, self.project) from exc
        return (attrs.get("queryValue") or {}).get("items") or []

    def status_now(self) -> str:
        """The VM's status as the API reports it now (ABSENT, or UNKNOWN when it cannot be read)."""
        try:
            inst = self.find_instance()
        except GceError:
            return "UNKNOWN"
        return inst.get("status", "UNKNOWN") if inst else "ABSENT"

    # ---- writes --------------------------------------------------------------------------------
    def _op(self, call: Any, op_zone: str | None, request: Any) -> dict[str, Any]:
        """Send one changing request and wait for its operation.

        Every changing request carries a requestId, so the retry policy may send it again after a
        lost reply or a dropped connection: the API answers a repeated requestId with the first
        operation instead of doing the work twice.
        """
        if isinstance(request, dict):
            request = dict(request, project=self.project, request_id=str(uuid.uuid4()))
        op = start(call, self.project, self.retry, request=request)
        try:
            result = wait(self.clients, op, self.project, op_zone, self.p["operation_timeout"], self.retry)
        except GceError as err:
            if err.kind in OPERATION_ERROR_KINDS:
                raise  # the operation itself failed: nothing was changed
            # The API accepted the change but its outcome could not be seen (a timeout, or the
            # waits were throttled or failed): count it as changed and say where the VM stands.
            self.changed = True
            # Reading the VM while throttled would only be throttled for another retry_deadline.
            state = "of unknown status" if err.kind == "throttled" else f"{self.status_now()} now"
            named = GceError(
                err.kind,
                f"{err}; the API accepted the request and instance {self.p['name']} is {state} (the "
                "operation may still finish: run again later"
                + (", or raise operation_timeout)" if err.kind == "timeout" else ")"),
                err.code,
            )
            named.names_state = True
            raise named from err
        self.changed = True
        return result

    def delete(self, kind: str, resource: dict[str, Any]) -> None:
        """Delete the instance or disk ``resource`` (``kind``: instance or disk) and wait."""
        zone = _last(resource["zone"])
        call = getattr(self.clients, f"{kind}s").delete_unary
        self._op(call, zone, {"zone": zone, kind: resource["name"]})

    def _action(self, zone: str, verb: str, **fields: Any) -> None:
        call = getattr(self.clients.instances, f"{verb}_unary")
        self._op(call, zone, dict(fields, zone=zone, instance=self.p["name"]))
        self.actions.append(f"{verb} in {zone}")

    def insert(self, zones: list[str], disk: dict[str, Any] | None) -> dict[str, Any]:
        """Try each zone in order; returns the created instance."""
        from google.cloud import compute_v1

        for zone in zones:
            body = instance_body(self.p, zone, disk)
            resource = compute_v1.Instance.from_json(json.dumps(body))
            # One requestId per zone attempt: retries of this insert are de-duplicated by the API.
            request = compute_v1.InsertInstanceRequest(
                project=self.project, zone=zone, instance_resource=resource, request_id=str(uuid.uuid4())
            )
            try:
                self._op(self.clients.instances.insert_unary, zone, request)
            except GceError as err:
                self.zones_tried.append({"zone": zone, "result": err.kind, "reason": _reason(err)})
                if err.kind != "stockout":
                    raise
                self.actions.append(f"stockout in {zone}")
                self.warnings.append(f"zone {zone} has no capacity ({err.code}); trying the next zone")
                continue
            self.zones_tried.append({"zone": zone, "result": "created", "reason": ""})
            self.actions.append(f"insert in {zone}")
            return self._get(self.clients.instances.get, zone=zone, instance=self.p["name"]) or {}
        raise GceError(
            "stockout",
            f"no capacity for {self.p['machine_type']} + {self.p['accelerator_count']} x "
            f"{self.p['accelerator_type']} in any of {', '.join(zones)}; add zones or retry later. "
            + "; ".join(f"{z['zone']}: {z['reason']}" for z in self.zones_tried),
            "ZONE_RESOURCE_POOL_EXHAUSTED",
        )

    def _call_fields(self, field: str, zone: str, inst: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The instances.* verb and request fields that change one compared field."""
        from google.cloud import compute_v1

        w = summarize_wanted(self.p)
        have = summarize_existing(inst)
        if field == "machine_type":
            body = compute_v1.InstancesSetMachineTypeRequest(
                machine_type=f"zones/{zone}/machineTypes/{w[field]}"
            )
            return "set_machine_type", {"instances_set_machine_type_request_resource": body}
        if field in ("accelerator_type", "accelerator_count"):
            gpus = []
            if w["accelerator_count"]:
                gpus = [
                    compute_v1.AcceleratorConfig(
                        accelerator_type=f"projects/{self.project}/zones/{zone}/acceleratorTypes/{w['accelerator_type']}",
                        accelerator_count=w["accelerator_count"],
                    )
                ]
            body = compute_v1.InstancesSetMachineResourcesRequest(guest_accelerators=gpus)
            return "set_machine_resources", {"instances_set_machine_resources_request_resource": body}
        if field == "scheduling":
            return "set_scheduling", {
                "scheduling_resource": compute_v1.Scheduling.from_json(json.dumps(w[field]))
            }
        if field == "service_account":
            body = compute_v1.InstancesSetServiceAccountRequest(
                email=w[field]["email"], scopes=w[field]["scopes"]
            )
            return "set_service_account", {"instances_set_service_account_request_resource": body}
        if field == "labels":
            body = compute_v1.InstancesSetLabelsRequest(
                labels=merged(field, have[field], w[field]), label_fingerprint=inst.get("labelFingerprint")
            )
            return "set_labels", {"instances_set_labels_request_resource": body}
        if field == "metadata":
            items = [
                compute_v1.Items(key=k, value=v)
                for k, v in sorted(merged(field, have[field], w[field]).items())
            ]
            body = compute_v1.Metadata(
                items=items, fingerprint=(inst.get("metadata") or {}).get("fingerprint")
            )
            return "set_metadata", {"metadata_resource": body}
        body = compute_v1.Tags(items=w["tags"], fingerprint=(inst.get("tags") or {}).get("fingerprint"))
        return "set_tags", {"tags_resource": body}

    def _stop_order(self, fields: list[str], inst: dict[str, Any]) -> list[str]:
        """Order the stopped-VM changes so that every step leaves a shape the API accepts.

        A GPU VM must TERMINATE on host maintenance, so TERMINATE is set before GPUs are added and
        MIGRATE after they are removed; the machine type goes first unless the current GPUs do
        not fit it (then the GPU change goes first).
        """
        have = summarize_existing(inst)
        w = summarize_wanted(self.p)
        order = [f for f in ("service_account",) if f in fields]
        terminate = w["scheduling"].get("onHostMaintenance") == "TERMINATE"
        if terminate and "scheduling" in fields:
            order.append("scheduling")
        gpu_fields = [f for f in ("accelerator_type", "accelerator_count") if f in fields][:1]
        machine_first = (
            gpu_problem(w["machine_type"], have["accelerator_type"], have["accelerator_count"]) is None
        )
        resources = (["machine_type"] if "machine_type" in fields else []) + gpu_fields
        order += resources if machine_first else list(reversed(resources))
        if not terminate and "scheduling" in fields:
            order.append("scheduling")
        return order

    def update(self, inst: dict[str, Any], todo: dict[str, list[str]]) -> dict[str, Any]:
        zone = _last(inst["zone"])
        for field in todo["in_place"]:
            verb, fields = self._call_fields(field, zone, inst)
            self._action(zone, verb, **fields)
        if todo["stop"]:
            was_running = inst["status"] != STOPPED
            if was_running:
                self._action(zone, "stop")
            for field in self._stop_order(todo["stop"], inst):
                verb, fields = self._call_fields(field, zone, inst)
                self._action(zone, verb, **fields)
            if was_running and self.p["state"] != "stopped":
                self._action(zone, "start")
        return self._get(self.clients.instances.get, zone=zone, instance=self.p["name"]) or inst


def _reason(err: GceError) -> str:
    return f"{err.code}: {err}" if err.code and not str(err).startswith(err.code) else str(err)


def describe(inst: dict[str, Any] | None) -> dict[str, Any]:
    """The instance fields the module returns."""
    if not inst:
        return {"status": "ABSENT", "zone": ""}
    nic = (inst.get("networkInterfaces") or [{}])[0]
    access = nic.get("accessConfigs") or [{}]
    gpus = inst.get("guestAccelerators") or []
    return {
        "id": str(inst.get("id", "")),
        "zone": _last(inst.get("zone")),
        "status": inst.get("status", ""),
        "machine_type": _last(inst.get("machineType")),
        "accelerators": [
            {"type": _last(g.get("acceleratorType")), "count": int(g.get("acceleratorCount") or 0)}
            for g in gpus
        ],
        "internal_ip": nic.get("networkIP", ""),
        "external_ip": access[0].get("natIP", ""),
        "disks": [
            {
                "name": _last(d.get("source")),
                "boot": bool(d.get("boot")),
                "auto_delete": bool(d.get("autoDelete")),
                "device_name": d.get("deviceName", ""),
                "size_gb": int(d.get("diskSizeGb") or 0),
            }
            for d in inst.get("disks") or []
        ],
    }


def describe_disk(disk: dict[str, Any] | None) -> dict[str, Any] | None:
    if not disk:
        return None
    return {
        "name": disk["name"],
        "zone": _last(disk.get("zone")),
        "size_gb": int(disk.get("sizeGb") or 0),
        "type": _last(disk.get("type")),
        "in_use": bool(disk.get("users")),
    }


def run(module: AnsibleModule, r: Runner) -> dict[str, Any]:
    """Fetch, compare, act; returns the result dict (GceError propagates, with ``r`` recording progress)."""
    p = module.params
    state = p["state"]
    inst = r.find_instance()
    result: dict[str, Any] = {"changed": False, "name": p["name"]}
    wanted = summarize_wanted(p)
    before = summarize_existing(inst) if inst else {}

    if state == "absent":
        disk = r.find_data_disk()
        old = diff_views(before, wanted)[0] if inst else {}
        result["diff"] = {"before": dict(old, status=inst["status"]) if inst else {}, "after": {}}
        if inst:
            result["changed"] = True
            if not module.check_mode:
                r.delete("instance", inst)
            r.actions.append(f"delete instance {p['name']} in {_last(inst['zone'])}")
            if disk and not module.check_mode:
                disk = r.find_data_disk()  # re-read: it is detached now
        if disk and p["delete_data_disk"]:
            result["changed"] = True
            if not module.check_mode:
                r.delete("disk", disk)
            r.actions.append(f"delete data disk {disk['name']} in {_last(disk['zone'])}")
            disk = None
        result.update(describe(None), data_disk=describe_disk(disk))
    elif inst is None:
        disk = r.find_data_disk() if p["data_disk"]["enabled"] else None
        zones = list(p["zones"])
        if disk:
            zone = _last(disk["zone"])
            if zones[0] != zone:
                r.warnings.append(f"data disk {disk['name']} exists in {zone}: creating the VM there only")
            zones = [zone]
            r.actions.append(f"reuse data disk {disk['name']} in {zone}")
        result["changed"] = True
        result["diff"] = {"before": {}, "after": dict(wanted, zone=zones[0], status="RUNNING")}
        if module.check_mode:
            r.actions.append(f"insert in {zones[0]} (first zone with capacity)")
            result.update(
                describe(None), status="PLANNED", zone=zones[0], body=instance_body(p, zones[0], disk)
            )
        else:
            inst = r.insert(zones, disk)
            if state == "stopped":
                r._action(_last(inst["zone"]), "stop")
                inst = r.find_instance() or inst
            result.update(describe(inst))
        result["data_disk"] = (
            describe_disk(r.find_data_disk()) if not module.check_mode else describe_disk(disk)
        )
    else:
        todo = changes(before, wanted)
        result["changes"] = todo
        old, new = diff_views(before, wanted)
        status_after = {"started": "RUNNING", "stopped": STOPPED}.get(state, inst["status"])
        result["diff"] = {"before": dict(old, status=inst["status"]), "after": dict(new, status=status_after)}
        if todo["recreate"]:
            module.fail_json(
                msg=f"instance {p['name']} differs in {', '.join(todo['recreate'])}, which cannot be changed "
                "on an existing VM: delete it (state=absent; the data disk is kept) and create it again",
                **result,
            )
        if todo["stop"] and not p["allow_stop"] and inst["status"] != STOPPED:
            module.fail_json(
                msg=f"instance {p['name']} differs in {', '.join(todo['stop'])}, which needs the VM stopped: "
                "set allow_stop=true to stop, update and start it",
                **result,
            )
        power = None
        if state == "started" and inst["status"] == STOPPED:
            power = "start"
        elif state == "stopped" and inst["status"] != STOPPED:
            power = "stop"
        if todo["in_place"] or todo["stop"] or power:
            result["changed"] = True
            zone = _last(inst["zone"])
            if module.check_mode:
                r.actions.extend(f"update {f}" for f in todo["in_place"] + todo["stop"])
                if power:
                    r.actions.append(f"{power} in {zone}")
            else:
                if power == "stop":
                    r._action(zone, "stop")
                    inst["status"] = STOPPED
                inst = r.update(inst, todo)
                if power == "start":
                    r._action(zone, "start")
                    inst = r.find_instance() or inst
        result.update(describe(inst), data_disk=describe_disk(r.find_data_disk()))
    if p["known_hosts"] and state != "absent" and inst and inst.get("status") == "RUNNING":
        result.update(host_keys(module, r, inst))
    result.update(actions=r.actions, zones_tried=r.zones_tried)
    for warning in r.warnings:
        module.warn(warning)
    return result


def host_keys(module: AnsibleModule, r: Runner, inst: dict[str, Any]) -> dict[str, Any]:
    """Wait for the running VM's published host keys and pin them; what the result adds."""
    p = module.params
    zone, vm_id = _last(inst["zone"]), str(inst.get("id", ""))
    vm = f"VM {p['name']} (project {r.project}, zone {zone}, id {vm_id})"
    key_alias = alias("gce", r.project, zone, p["name"], vm_id)
    poll = min(5.0, max(0.05, p["host_keys_timeout"] / 20))
    keys = wait_for_keys(lambda: r.guest_hostkeys(zone), vm, p["host_keys_timeout"], poll)
    out: dict[str, Any] = {
        "host_key_alias": key_alias,
        "host_keys": keys,
        "ssh_common_args": ssh_common_args(p["known_hosts"], key_alias),
    }
    if pin(p["known_hosts"], key_alias, keys, vm):
        r.actions.append(f"pin SSH host keys of {p['name']} in {p['known_hosts']}")
        if not module.check_mode:
            out["changed"] = True
    return out


def failure(module: AnsibleModule, r: Runner, err: GceError) -> dict[str, Any]:
    """What a failed run reports: the error, what it already changed, and the VM as it is now."""
    now = {"status": "UNKNOWN", "zone": ""}
    if err.kind != "throttled":  # reading again would only be throttled for another retry_deadline
        with contextlib.suppress(GceError):
            now = describe(r.find_instance())
    msg = str(err)
    if r.changed and not getattr(err, "names_state", False):
        msg += f" (already done: {', '.join(r.actions)}; instance {module.params['name']} is {now['status']} now)"
    for warning in r.warnings:
        module.warn(warning)
    return dict(
        now,
        msg=msg,
        changed=r.changed,
        name=module.params["name"],
        actions=r.actions,
        zones_tried=r.zones_tried,
        error_kind=err.kind,
        error_code=err.code,
        quota=err.quota,
    )


def main() -> None:
    module = cloud_module(ARGUMENT_SPEC)
    if not HAS_GOOGLE:
        module.fail_json(msg=missing_required_lib("google-cloud-compute"), exception=str(IMPORT_ERROR))
    if not module.params["zones"]:
        module.fail_json(msg="zones must name at least one zone")
    if module.params["host_keys_timeout"] <= 0:
        module.fail_json(msg="host_keys_timeout must be above 0", error_kind="invalid")
    problem = check_numbers(module.params)  # before any request, credentials included
    if problem:
        module.fail_json(msg=problem, error_kind="invalid")
    try:
        r = Runner(module)
    except ValueError as err:  # credentials: raised before any request
        module.fail_json(msg=str(err), error_kind="auth")
    try:
        result = run(module, r)
    except GceError as err:
        module.fail_json(**failure(module, r, err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
