"""The fake's IAM: service accounts, custom roles, allow policies, and the permissions they grant.

Built from Google's references rather than from what our modules send:

- IAM admin (iam.googleapis.com v1: projects.serviceAccounts create/get/patch/delete,
  projects.roles create/get/patch/delete/undelete). The official Python client
  (google-cloud-iam's ``iam_admin_v1``) speaks only gRPC, so ``FakeIamServer`` serves the
  ``google.iam.admin.v1.IAM`` service over plain-text gRPC on 127.0.0.1; each call is logged with
  the REST method and path the reference gives it (``GET /v1/projects/P/roles/R``), so the fake's
  request log and ``mutating_requests`` read it as they read the Compute calls. Server-side fields
  are filled in as the API fills them: an account's uniqueId (21 digits), email, oauth2ClientId,
  etag; a role's name, etag and ``deleted``. Deleting a custom role is soft: the role stays,
  ``deleted: true``, for 7 days; ``undelete`` brings it back, and its id cannot be taken by a new
  role meanwhile (https://cloud.google.com/iam/docs/creating-custom-roles#deleting-custom-role).
  Deleting an account turns its members in every policy into
  ``deleted:serviceAccount:EMAIL?uid=N``, as IAM does: a new account of the same email inherits no
  grant (https://cloud.google.com/iam/docs/service-accounts-delete-undelete).
- Allow policies (``{version, etag, bindings}``) on a project (Resource Manager v3
  ``projects.getIamPolicy`` / ``setIamPolicy``, ``POST /v3/projects/P:getIamPolicy``) and on an
  instance (Compute ``instances.getIamPolicy`` / ``setIamPolicy``). A set with a stale etag is
  refused (Resource Manager: 409 ABORTED, "There were concurrent policy changes...", the text IAM
  documents for read-modify-write; Compute: 412 conditionNotMet, wording not verified); a binding
  naming a role that does not exist or is deleted, a member of an unknown kind or a service
  account that does not exist, or a condition without ``version: 3``, is a 400. An instance's
  policy is kept by the instance's id: it goes with the instance.
- Enforcement: a token registered in ``FakeIam.tokens`` acts as a service account, whose
  permissions on a resource are the union of the included permissions of the custom roles bound
  to it on that resource (an instance's own policy) and on its project. A deleted role grants
  nothing. A binding with a condition grants nothing here: the fake does not evaluate CEL, and
  failing closed keeps a test from passing on a grant the real API might not give.
"""

from __future__ import annotations

import base64
import copy
import re
import threading
import uuid
from concurrent import futures
from typing import Any

from tests.fake_compute.state import ApiError, FakeCompute

# The REST reference's words for a project's policy read-modify-write conflict (IAM "Policy"
# overview, etag: "...returns a 409 ABORTED error: There were concurrent policy changes...").
CONCURRENT = (
    "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff."
)
# The etag an empty policy carries on every Google API that has one.
EMPTY_ETAG = "ACAB"
_ACCOUNT_ID = re.compile(r"^[a-z]([-a-z0-9]{4,28}[a-z0-9])$")  # 6-30 characters
_ROLE_ID = re.compile(r"^[a-zA-Z0-9_.]{3,64}$")
_MEMBER = re.compile(
    r"^(user|serviceAccount|group|domain|deleted:serviceAccount|deleted:user|deleted:group):.+$"
)
# Permissions a custom role may include, as far as the fake knows them: the ones its routes check,
# and the waker's. Anything else is refused as the API refuses a permission it does not know.
KNOWN_PERMISSIONS = frozenset(
    {
        "compute.instances.get", "compute.instances.start", "compute.instances.stop",
        "compute.instances.delete", "compute.instances.create", "compute.instances.list",
        "compute.instances.getIamPolicy", "compute.instances.setIamPolicy",
        "compute.instances.getGuestAttributes", "compute.instances.setMetadata",
        "compute.zoneOperations.get", "compute.zoneOperations.list",
        "compute.globalOperations.get", "compute.disks.get", "compute.disks.delete",
        "compute.firewalls.get", "compute.firewalls.create", "compute.firewalls.update",
        "compute.firewalls.delete",
        "resourcemanager.projects.getIamPolicy", "resourcemanager.projects.setIamPolicy",
    }
)  # fmt: skip
STAGES = frozenset({"ALPHA", "BETA", "GA", "DEPRECATED", "DISABLED", "EAP"})
_INSTANCE = re.compile(r"^projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$")

# Route handlers of server.py this module answers (and strict.check holds to IAM's shapes).
HANDLERS = frozenset(
    {"get_instance_iam_policy", "set_instance_iam_policy", "get_project_iam_policy", "set_project_iam_policy"}
)
_P = r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"
ROUTES = [
    ("GET", _P + "/getIamPolicy", "get_instance_iam_policy"),
    ("POST", _P + "/setIamPolicy", "set_instance_iam_policy"),
    (
        "POST",
        r"/v3/projects/(?P<project>[^/:]+):getIamPolicy",
        "get_project_iam_policy",
    ),
    (
        "POST",
        r"/v3/projects/(?P<project>[^/:]+):setIamPolicy",
        "set_project_iam_policy",
    ),
]
PERMISSIONS = {
    "get_instance_iam_policy": "compute.instances.getIamPolicy",
    "set_instance_iam_policy": "compute.instances.setIamPolicy",
    "get_project_iam_policy": "resourcemanager.projects.getIamPolicy",
    "set_project_iam_policy": "resourcemanager.projects.setIamPolicy",
}
# google.rpc.Code name -> HTTP status, for errors outside Compute (Resource Manager's JSON errors
# carry code, message and status, and no Compute-style errors[] list).
_HTTP = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "ABORTED": 409,
         "FAILED_PRECONDITION": 400, "PERMISSION_DENIED": 403}  # fmt: skip


class RpcError(ApiError):
    """An error of a Google API other than Compute: ``{"error": {code, message, status}}``; over
    gRPC, the status code of that name."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(_HTTP[status], message)
        self.rpc_status = status
        self.body = {"error": {"code": _HTTP[status], "message": message, "status": status}}


def _etag() -> str:
    return base64.b64encode(uuid.uuid4().bytes[:8]).decode()


class FakeIam:
    """IAM state beside one FakeCompute (the same lock): accounts, roles, policies, acting tokens."""

    def __init__(self, api: FakeCompute) -> None:
        self.api = api
        self.accounts: dict[str, dict[str, Any]] = {}  # email -> ServiceAccount (REST JSON)
        self.roles: dict[str, dict[str, Any]] = {}  # projects/P/roles/R -> Role (REST JSON)
        self.project_policies: dict[str, dict[str, Any]] = {}
        self.instance_policies: dict[str, dict[str, Any]] = {}  # instance id -> Policy
        # token -> the service account's email it acts as (the metadata server's token for a VM).
        self.tokens: dict[str, str] = {}

    # ---- service accounts ------------------------------------------------------------------
    def create_account(self, project: str, account_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        if not _ACCOUNT_ID.match(account_id):
            raise RpcError(
                "INVALID_ARGUMENT",
                f"Invalid account_id '{account_id}': 6-30 lowercase letters, digits or hyphens, "
                "starting with a letter and not ending with a hyphen.",
            )
        email = f"{account_id}@{project}.iam.gserviceaccount.com"
        if email in self.accounts:
            raise RpcError(
                "ALREADY_EXISTS",
                f"Service account {account_id} already exists within project projects/{project}.",
            )
        unique = str(10**20 + uuid.uuid4().int % (9 * 10**20))
        account = {
            "name": f"projects/{project}/serviceAccounts/{email}",
            "projectId": project,
            "uniqueId": unique,
            "email": email,
            "etag": base64.b64encode(b"\x00" * 8).decode(),  # the API's accounts all carry this one
            "oauth2ClientId": unique,
        }
        for key in ("displayName", "description"):
            if fields.get(key):
                account[key] = fields[key]
        self.accounts[email] = account
        return copy.deepcopy(account)

    def _account(self, name: str) -> dict[str, Any]:
        email = name.rsplit("/", 1)[-1]
        if email not in self.accounts or not name.startswith("projects/"):
            raise RpcError("NOT_FOUND", f"Service account {name} does not exist.")
        return self.accounts[email]

    def get_account(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._account(name))

    def patch_account(self, name: str, fields: dict[str, Any], mask: list[str]) -> dict[str, Any]:
        account = self._account(name)
        unknown = set(mask) - {"display_name", "description"}
        if not mask or unknown:
            raise RpcError("INVALID_ARGUMENT", f"Invalid update_mask: {sorted(unknown) or 'empty'}.")
        for path in mask:
            key = "displayName" if path == "display_name" else "description"
            if fields.get(key):
                account[key] = fields[key]
            else:
                account.pop(key, None)
        return copy.deepcopy(account)

    def delete_account(self, name: str) -> None:
        account = self._account(name)
        del self.accounts[account["email"]]
        member = f"serviceAccount:{account['email']}"
        gone = f"deleted:{member}?uid={account['uniqueId']}"
        for policy in [*self.project_policies.values(), *self.instance_policies.values()]:
            for binding in policy.get("bindings", []):
                binding["members"] = sorted(gone if m == member else m for m in binding["members"])

    # ---- custom roles ----------------------------------------------------------------------
    def _validate_role(self, fields: dict[str, Any]) -> None:
        for permission in fields.get("includedPermissions", []):
            if permission not in KNOWN_PERMISSIONS:
                raise RpcError("INVALID_ARGUMENT", f"Permission {permission} is not valid.")
        if fields.get("stage", "ALPHA") not in STAGES:
            raise RpcError("INVALID_ARGUMENT", f"Invalid stage {fields.get('stage')!r}.")
        if len(fields.get("title", "")) > 100:
            raise RpcError("INVALID_ARGUMENT", "The title may have 100 characters at most.")

    def create_role(self, parent: str, role_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        if not _ROLE_ID.match(role_id):
            raise RpcError("INVALID_ARGUMENT", f"The role id {role_id!r} is invalid: [a-zA-Z0-9_.]{{3,64}}.")
        name = f"{parent}/roles/{role_id}"
        if name in self.roles:  # a soft-deleted role holds its id too
            raise RpcError("ALREADY_EXISTS", f"A role named {role_id} in {parent} already exists.")
        self._validate_role(fields)
        role = {"name": name, "stage": "ALPHA", "etag": _etag()}
        role.update(
            {
                k: v
                for k, v in fields.items()
                if k in ("title", "description", "includedPermissions", "stage") and v
            }
        )
        if "includedPermissions" in role:
            role["includedPermissions"] = sorted(set(role["includedPermissions"]))
        self.roles[name] = role
        return copy.deepcopy(role)

    def _role(self, name: str) -> dict[str, Any]:
        if name not in self.roles:
            raise RpcError("NOT_FOUND", f"The role named {name} was not found.")
        return self.roles[name]

    def get_role(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._role(name))

    def _check_etag(self, role: dict[str, Any], etag: str | None) -> None:
        if etag and etag != role["etag"]:
            raise RpcError("ABORTED", CONCURRENT)

    def update_role(self, name: str, fields: dict[str, Any], mask: list[str]) -> dict[str, Any]:
        role = self._role(name)
        if role.get("deleted"):
            raise RpcError(
                "FAILED_PRECONDITION", f"You can't update the deleted role {name}; undelete it first."
            )
        self._check_etag(role, fields.get("etag"))
        self._validate_role(fields)
        keys = {"title": "title", "description": "description", "included_permissions": "includedPermissions",
                "stage": "stage"}  # fmt: skip
        unknown = set(mask) - set(keys)
        if unknown:
            raise RpcError("INVALID_ARGUMENT", f"Invalid update_mask path {sorted(unknown)[0]}.")
        for path in mask or list(keys):
            value = fields.get(keys[path])
            if value:
                role[keys[path]] = sorted(set(value)) if path == "included_permissions" else value
            else:
                role.pop(keys[path], None)
        role["etag"] = _etag()
        return copy.deepcopy(role)

    def delete_role(self, name: str, etag: str | None) -> dict[str, Any]:
        role = self._role(name)
        if role.get("deleted"):
            raise RpcError("FAILED_PRECONDITION", f"The role {name} is already deleted.")
        self._check_etag(role, etag)
        role["deleted"] = True
        role["etag"] = _etag()
        return copy.deepcopy(role)

    def undelete_role(self, name: str, etag: str | None) -> dict[str, Any]:
        role = self._role(name)
        if not role.get("deleted"):
            raise RpcError("FAILED_PRECONDITION", f"The role {name} is not deleted.")
        self._check_etag(role, etag)
        role.pop("deleted")
        role["etag"] = _etag()
        return copy.deepcopy(role)

    # ---- allow policies --------------------------------------------------------------------
    def _validate_policy(self, policy: dict[str, Any], project: str) -> list[dict[str, Any]]:
        """The bindings as the API stores them (members sorted, empty bindings dropped), or a 400."""
        bindings = []
        conditional = False
        for binding in policy.get("bindings") or []:
            role = binding.get("role", "")
            if role.startswith("projects/") or role.startswith("organizations/"):
                if role not in self.roles or self.roles[role].get("deleted"):
                    raise RpcError(
                        "INVALID_ARGUMENT", f"Role ({role}) does not exist in the resource's hierarchy."
                    )
            elif not role.startswith("roles/"):
                raise RpcError("INVALID_ARGUMENT", f"Role ({role}) is not a role name.")
            for member in binding.get("members") or []:
                if not _MEMBER.match(member):
                    raise RpcError("INVALID_ARGUMENT", f"Invalid member '{member}'.")
                if (
                    member.startswith("serviceAccount:")
                    and member.removeprefix("serviceAccount:") not in self.accounts
                ):
                    raise RpcError(
                        "INVALID_ARGUMENT",
                        f"Service account {member.removeprefix('serviceAccount:')} does not exist.",
                    )
            conditional = conditional or bool(binding.get("condition"))
            if binding.get("members"):
                kept = {"role": role, "members": sorted(set(binding["members"]))}
                if binding.get("condition"):
                    kept["condition"] = binding["condition"]
                bindings.append(kept)
        if conditional and policy.get("version") != 3:
            raise RpcError("INVALID_ARGUMENT", "A policy with conditions must be of version 3.")
        return bindings

    def _stored(self, policy: dict[str, Any] | None) -> dict[str, Any]:
        return copy.deepcopy(policy) if policy else {"version": 1, "etag": EMPTY_ETAG}

    def _write(self, current: dict[str, Any] | None, policy: dict[str, Any], project: str) -> dict[str, Any]:
        bindings = self._validate_policy(policy, project)
        stored: dict[str, Any] = {
            "version": 3 if any("condition" in b for b in bindings) else 1,
            "etag": _etag(),
        }
        if bindings:
            stored["bindings"] = bindings
        return stored

    def get_project_policy(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - {"options"}
        if unknown:
            raise RpcError(
                "INVALID_ARGUMENT", f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}".'
            )
        return self._stored(self.project_policies.get(project))

    def set_project_policy(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - {"policy", "updateMask"}
        if unknown or not isinstance(body.get("policy"), dict):
            raise RpcError(
                "INVALID_ARGUMENT", "Invalid JSON payload received: a SetIamPolicyRequest needs 'policy'."
            )
        policy = body["policy"]
        current = self._stored(self.project_policies.get(project))
        if policy.get("etag") and policy["etag"] != current["etag"]:
            raise RpcError("ABORTED", CONCURRENT)
        self.project_policies[project] = self._write(current, policy, project)
        return copy.deepcopy(self.project_policies[project])

    def _instance_id(self, project: str, zone: str, name: str) -> str:
        return self.api.get_instance(zone, name, project)["id"]  # the API's 404 when there is none

    def get_instance_policy(
        self, project: str, zone: str, name: str, query: dict[str, str]
    ) -> dict[str, Any]:
        unknown = set(query) - {"optionsRequestedPolicyVersion"}
        if unknown:
            raise ApiError(400, f"Invalid parameter {sorted(unknown)[0]}.")
        policy = self._stored(self.instance_policies.get(self._instance_id(project, zone, name)))
        if policy["version"] == 1 and "bindings" not in policy:
            policy.pop("version")  # Compute leaves an empty policy's version out
        return policy

    def set_instance_policy(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        from tests.fake_compute.state import _parse

        _parse("ZoneSetPolicyRequest", body, "resource")
        key = self._instance_id(project, zone, name)
        policy = body.get("policy") or {}
        current = self._stored(self.instance_policies.get(key))
        if policy.get("etag") and policy["etag"] != current["etag"]:
            raise ApiError(412, "Precondition not met for 'policy.etag'.", "conditionNotMet")
        try:
            self.instance_policies[key] = self._write(current, policy, project)
        except RpcError as err:  # Compute answers its own error shape
            raise ApiError(400, str(err), "invalid") from err
        return copy.deepcopy(self.instance_policies[key])

    # ---- enforcement -----------------------------------------------------------------------
    def identity(self, token: str) -> str | None:
        """The live service account ``token`` acts as, or None (then it is no identity's token)."""
        email = self.tokens.get(token)
        return email if email in self.accounts else None

    def allows(self, email: str, permission: str, resource: str) -> bool:
        """Whether ``email`` holds ``permission`` on ``resource`` (projects/P/...), through the
        custom roles bound to it on the resource itself (an instance) or on its project."""
        with self.api.lock:
            parts = resource.split("/")
            if len(parts) < 2 or parts[0] != "projects":
                return False
            policies = [self.project_policies.get(parts[1])]
            match = _INSTANCE.match(resource)
            if match:
                project, zone, name = match.groups()
                inst = self.api.instances.get((zone, name))
                if inst is not None and f"/projects/{project}/zones/" in inst["zone"]:
                    policies.append(self.instance_policies.get(inst["id"]))
            member = f"serviceAccount:{email}"
            for policy in filter(None, policies):
                for binding in policy.get("bindings", []):
                    if member not in binding["members"] or binding.get("condition"):
                        continue
                    role = self.roles.get(binding["role"])
                    if role and not role.get("deleted") and permission in role.get("includedPermissions", []):
                        return True
            return False


def of(api: FakeCompute) -> FakeIam:
    """The FakeIam beside ``api`` (made on first use, so a FakeCompute made alone has one too)."""
    with api.lock:
        if not hasattr(api, "iam"):
            api.iam = FakeIam(api)  # type: ignore[attr-defined]
        return api.iam  # type: ignore[attr-defined]


def act_as(server: Any, token: str, email: str) -> None:
    """From now on, ``token`` acts as the service account ``email`` on ``server`` (a
    FakeComputeServer): the server checks every request's permissions, and this token's come from
    the policies. Tokens of the permissions table, if any, keep theirs."""
    handler = server.httpd.RequestHandlerClass
    if handler.permissions is None:
        handler.permissions = {}
    of(server.api).tokens[token] = email


def handle(
    api: FakeCompute, handler: str, a: dict[str, str], query: dict[str, str], body: dict[str, Any]
) -> Any:
    """server.dispatch's call for this module's routes (under the API's lock)."""
    iam = of(api)
    if handler == "get_instance_iam_policy":
        return iam.get_instance_policy(a["project"], a["zone"], a["name"], query)
    if handler == "set_instance_iam_policy":
        return iam.set_instance_policy(a["project"], a["zone"], a["name"], body)
    if handler == "get_project_iam_policy":
        return iam.get_project_policy(a["project"], body)
    return iam.set_project_policy(a["project"], body)


def check(handler: str, status: int, body: Any) -> None:
    """strict.check for this module's routes: Compute's Policy and errors by Compute's rules
    (strict.py), Resource Manager's by google.iam.v1's Policy and the plain JSON error."""
    from google.iam.v1 import policy_pb2
    from google.protobuf import json_format

    from tests.fake_compute import strict

    if handler.endswith("instance_iam_policy"):
        if status >= 400:
            strict.check_error(status, body)
        else:
            strict.check_message("Policy", body)
        return
    if status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or set(error) - {"code", "message", "status", "details"}:
            raise strict.ResponseMismatch(
                f"error body: {body!r} is not {{'error': {{code, message, status}}}}"
            )
        if error.get("code") != status or not error.get("message") or error.get("status") not in _HTTP:
            raise strict.ResponseMismatch(f"error body: {body!r}")
        return
    try:
        json_format.ParseDict(body, policy_pb2.Policy(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise strict.ResponseMismatch(f"Policy: {str(exc).splitlines()[0]}") from exc
    if "bindings" in body and not body["bindings"]:
        raise strict.ResponseMismatch("Policy.bindings: an empty list, which the API leaves out")


# ---- the IAM admin API over gRPC -------------------------------------------------------------
# method -> (request type, response type, REST method, REST path template from the request)
def _grpc_table() -> dict[str, tuple[Any, Any, str, Any]]:
    from google.cloud import iam_admin_v1 as v1

    return {
        "CreateServiceAccount": (v1.CreateServiceAccountRequest, v1.ServiceAccount, "POST",
                                 lambda r: f"/v1/{r.name}/serviceAccounts"),
        "GetServiceAccount": (v1.GetServiceAccountRequest, v1.ServiceAccount, "GET", lambda r: f"/v1/{r.name}"),
        "PatchServiceAccount": (v1.PatchServiceAccountRequest, v1.ServiceAccount, "PATCH",
                                lambda r: f"/v1/{r.service_account.name}"),
        "DeleteServiceAccount": (v1.DeleteServiceAccountRequest, None, "DELETE", lambda r: f"/v1/{r.name}"),
        "CreateRole": (v1.CreateRoleRequest, v1.Role, "POST", lambda r: f"/v1/{r.parent}/roles"),
        "GetRole": (v1.GetRoleRequest, v1.Role, "GET", lambda r: f"/v1/{r.name}"),
        "UpdateRole": (v1.UpdateRoleRequest, v1.Role, "PATCH", lambda r: f"/v1/{r.name}"),
        "DeleteRole": (v1.DeleteRoleRequest, v1.Role, "DELETE", lambda r: f"/v1/{r.name}"),
        "UndeleteRole": (v1.UndeleteRoleRequest, v1.Role, "POST", lambda r: f"/v1/{r.name}:undelete"),
    }  # fmt: skip


def _rest(message: Any) -> dict[str, Any]:
    """A proto-plus message as the REST JSON the reference documents (camelCase, defaults left out)."""
    import json

    return json.loads(type(message).to_json(message, use_integers_for_enums=False))


def _answer(iam: FakeIam, method: str, request: Any) -> dict[str, Any] | None:
    if method == "CreateServiceAccount":
        if not request.name.startswith("projects/"):
            raise RpcError("INVALID_ARGUMENT", "name must be projects/PROJECT.")
        return iam.create_account(
            request.name.split("/")[1], request.account_id, _rest(request.service_account)
        )
    if method == "GetServiceAccount":
        return iam.get_account(request.name)
    if method == "PatchServiceAccount":
        mask = list(request.update_mask.paths)
        return iam.patch_account(request.service_account.name, _rest(request.service_account), mask)
    if method == "DeleteServiceAccount":
        iam.delete_account(request.name)
        return None
    if method == "CreateRole":
        return iam.create_role(request.parent, request.role_id, _rest(request.role))
    if method == "GetRole":
        return iam.get_role(request.name)
    if method == "UpdateRole":
        return iam.update_role(request.name, _rest(request.role), list(request.update_mask.paths))
    if method == "DeleteRole":
        return iam.delete_role(
            request.name, base64.b64encode(request.etag).decode() if request.etag else None
        )
    return iam.undelete_role(request.name, base64.b64encode(request.etag).decode() if request.etag else None)


class FakeIamServer:
    """The IAM admin API (``google.iam.admin.v1.IAM``) on 127.0.0.1 over plain-text gRPC, beside a
    FakeCompute's state; ``endpoint`` (``http://127.0.0.1:PORT``) is what the modules' IAM
    ``api_endpoint`` takes. A context manager, like FakeComputeServer."""

    def __init__(self, api: FakeCompute) -> None:
        import grpc

        self.api = api
        self.iam = of(api)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {name: self._handler(name, *row) for name, row in _grpc_table().items()}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("google.iam.admin.v1.IAM", handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self._lock = threading.Lock()

    def _handler(self, method: str, request_type: Any, response_type: Any, verb: str, path: Any) -> Any:
        import grpc
        from google.protobuf import empty_pb2

        def call(request: Any, context: Any) -> Any:
            self.api.log.append({"method": verb, "path": path(request), "query": {}, "body": _rest(request)})
            try:
                with self.api.lock:
                    answer = _answer(self.iam, method, request)
            except RpcError as err:
                context.abort(getattr(grpc.StatusCode, err.rpc_status), str(err))
            if response_type is None:
                return empty_pb2.Empty()
            return response_type.from_json(__import__("json").dumps(answer), ignore_unknown_fields=False)

        serialize = (lambda m: m.SerializeToString()) if response_type is None else response_type.serialize
        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=request_type.deserialize, response_serializer=serialize
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeIamServer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None)
