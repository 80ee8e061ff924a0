"""Clients and policy edits for the IAM modules (gce_iam_account, gce_iam_role, gce_iam_binding).

The clients are Google's own: google-cloud-iam's ``iam_admin_v1`` for service accounts and custom
roles, google-cloud-resource-manager's ``resourcemanager_v3.ProjectsClient`` for a project's
policy, google-cloud-compute's ``InstancesClient`` for an instance's. ``iam_admin_v1`` has no REST
transport (gRPC only), so its ``api_endpoint`` override is a gRPC address; given as
``http://host:port`` it is reached over a plain-text channel (the local fake in tests), as an
``http://`` endpoint makes the REST clients speak plain HTTP.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.module_utils.basic import missing_required_lib
from ansible.module_utils.gce_client import HAS_GOOGLE, IMPORT_ERROR, credentials
from ansible.module_utils.gce_errors import classify_exception

try:
    from google.api_core.client_options import ClientOptions
except ImportError:  # reported by the module through missing_required_lib
    ClientOptions = None  # type: ignore[assignment,misc]

# IAM and Resource Manager take no narrower scope than cloud-platform.
CLOUD_PLATFORM = ["https://www.googleapis.com/auth/cloud-platform"]
# How many times a policy's read-modify-write is tried when another writer got in between (the
# etag no longer matches): IAM's own advice is to retry the whole read-modify-write.
POLICY_ATTEMPTS = 5


class IamError(Exception):
    """A refusal the module reports as is."""


def _options(api_endpoint: str | None) -> Any:
    return ClientOptions(api_endpoint=api_endpoint) if api_endpoint else None


def iam_admin_client(auth_kind: str, service_account_file: str | None, api_endpoint: str | None) -> Any:
    """An ``iam_admin_v1.IAMClient`` (gRPC); ``http://host:port`` is a plain-text channel there."""
    from google.cloud import iam_admin_v1

    if api_endpoint and api_endpoint.startswith("http://"):
        import grpc
        from google.cloud.iam_admin_v1.services.iam.transports import IAMGrpcTransport

        channel = grpc.insecure_channel(api_endpoint.removeprefix("http://"))
        return iam_admin_v1.IAMClient(transport=IAMGrpcTransport(channel=channel))
    creds = credentials(auth_kind, service_account_file, CLOUD_PLATFORM)
    return iam_admin_v1.IAMClient(credentials=creds, client_options=_options(api_endpoint))


def projects_client(auth_kind: str, service_account_file: str | None, api_endpoint: str | None) -> Any:
    """A Resource Manager v3 ``ProjectsClient`` over REST."""
    from google.cloud import resourcemanager_v3

    creds = credentials(auth_kind, service_account_file, CLOUD_PLATFORM)
    return resourcemanager_v3.ProjectsClient(
        credentials=creds, client_options=_options(api_endpoint), transport="rest"
    )


def instances_client(auth_kind: str, service_account_file: str | None, api_endpoint: str | None) -> Any:
    """A Compute ``InstancesClient`` over REST (its IAM policy methods)."""
    from google.cloud import compute_v1

    creds = credentials(auth_kind, service_account_file, CLOUD_PLATFORM)
    return compute_v1.InstancesClient(
        credentials=creds, client_options=_options(api_endpoint), transport="rest"
    )


def open_client(module: Any, build: Any, library: str) -> Any:
    """The client ``build`` (iam_admin_client, projects_client, instances_client) makes from the
    running module's credential and endpoint options. The module fails, before any request, when
    google-cloud-compute (whose credentials every client uses) or ``library`` (the package
    ``build`` imports) is missing, or when no credentials are found."""
    if not HAS_GOOGLE:
        module.fail_json(msg=missing_required_lib("google-cloud-compute"), exception=str(IMPORT_ERROR))
    p = module.params
    try:
        return build(p["auth_kind"], p["service_account_file"], p["api_endpoint"])
    except ImportError as exc:
        module.fail_json(msg=missing_required_lib(library), exception=str(exc))
    except ValueError as err:  # credentials: raised before any request
        module.fail_json(msg=str(err), error_kind="auth")


def get_or_none(call: Any, retry: Any, **kwargs: Any) -> Any:
    """``call(**kwargs)``, None when the API answers 404."""
    try:
        return call(retry=retry, **kwargs)
    except Exception as exc:
        if classify_exception(exc) == "notfound":
            return None
        raise


def describe(exc: Exception, api: str) -> str:
    """One line for a failed request: the API, the status and the API's own message."""
    code = getattr(exc, "code", "")
    return f"{api} error {code}: {getattr(exc, 'message', '') or exc}"


def with_member(
    bindings: list[dict[str, Any]], role: str, member: str, present: bool
) -> list[dict[str, Any]]:
    """``bindings`` (REST JSON) with ``member`` in (or out of) the unconditional binding of ``role``.

    Every other binding, conditional ones of the same role included, is kept as it is; a binding
    left without members is dropped, as the API drops it.
    """
    out: list[dict[str, Any]] = []
    placed = False
    for binding in bindings:
        binding = dict(binding, members=sorted(binding.get("members") or []))
        if binding.get("role") == role and not binding.get("condition"):
            members = set(binding["members"])
            if present:
                members.add(member)
                placed = True
            else:
                members.discard(member)
            binding["members"] = sorted(members)
        if binding["members"]:
            out.append(binding)
    if present and not placed:
        out.append({"role": role, "members": [member]})
    return out


def has_member(bindings: list[dict[str, Any]], role: str, member: str) -> bool:
    """Whether an unconditional binding of ``role`` holds ``member``."""
    return any(
        b.get("role") == role and not b.get("condition") and member in (b.get("members") or [])
        for b in bindings
    )


def is_conflict(exc: Exception) -> bool:
    """The policy changed since it was read: 409 ABORTED (IAM), or 412 (Compute's etag precondition)."""
    return getattr(exc, "code", None) in (409, 412)


def read_modify_write(read: Any, write: Any, change: Any) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """IAM's read-modify-write of a policy: ``read()`` gives (policy dict, etag, version);
    ``change(bindings)`` the bindings wanted, ``write(bindings, etag, version)`` sends them with the
    etag read, so a write that raced another one is refused (409/412) and the whole cycle is done
    again. Returns (before, after, changed); ``write`` None is check mode (nothing is sent)."""
    for attempt in range(POLICY_ATTEMPTS):
        policy, etag, version = read()
        before = policy.get("bindings") or []
        after = change(before)
        changed = normalized(after) != normalized(before)
        if not changed or write is None:
            return {"bindings": before}, {"bindings": after}, changed
        try:
            write(after, etag, version)
        except Exception as exc:
            if is_conflict(exc) and attempt + 1 < POLICY_ATTEMPTS:
                time.sleep(0.2 * 2**attempt)
                continue
            raise
        return {"bindings": before}, {"bindings": after}, True
    raise IamError("the policy kept changing under the read-modify-write")  # not reached


def normalized(bindings: list[dict[str, Any]]) -> list[tuple[str, tuple[str, ...], str]]:
    """Bindings in a comparable form (order of bindings and members does not matter)."""
    return sorted(
        (
            b.get("role", ""),
            tuple(sorted(b.get("members") or [])),
            repr(sorted((b.get("condition") or {}).items())),
        )
        for b in bindings
        if b.get("members")
    )
