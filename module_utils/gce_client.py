"""Build the google-cloud-compute clients one module run needs, all with the same options.

Every client shares the credentials and ``api_endpoint``; an endpoint given with ``http://`` makes
the REST transport speak plain HTTP (used with the local fake API in tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ansible.module_utils.basic import AnsibleModule

try:
    import google.auth
    import google.auth.exceptions
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1
    from google.oauth2 import service_account

    HAS_GOOGLE = True
    IMPORT_ERROR = None
except ImportError as exc:  # the module reports it with missing_required_lib
    HAS_GOOGLE = False
    IMPORT_ERROR = exc

SCOPES = ["https://www.googleapis.com/auth/compute"]

# Options every module that calls a Google Cloud API accepts (plugins/doc_fragments/gce_auth.py).
AUTH_ARGUMENT_SPEC: dict[str, Any] = {
    "project": {"type": "str", "required": True},
    "auth_kind": {
        "type": "str",
        "default": "application",
        "choices": ["application", "serviceaccount", "anonymous"],
    },
    "service_account_file": {"type": "path"},
    "api_endpoint": {"type": "str"},
}

# The state option of the modules that keep one resource there or not (gce_firewall, gce_iam_*),
# documented by the fragment google_cloud.state (plugins/doc_fragments/google_cloud.py STATE).
PRESENT_OR_ABSENT: dict[str, Any] = {"type": "str", "default": "present", "choices": ["present", "absent"]}


def cloud_module(argument_spec: dict[str, Any]) -> AnsibleModule:
    """The AnsibleModule of a module that calls a Google Cloud API: its options and the shared ones,
    whose rule is checked before any of the module's own code runs."""
    return AnsibleModule(
        argument_spec=dict(AUTH_ARGUMENT_SPEC, **argument_spec),
        required_if=[("auth_kind", "serviceaccount", ("service_account_file",))],
        supports_check_mode=True,
    )


@dataclass
class Clients:
    """The clients one run uses; built lazily would save little, so all at once."""

    instances: Any
    disks: Any
    zone_operations: Any
    firewalls: Any
    global_operations: Any


def credentials(auth_kind: str, service_account_file: str | None, scopes: list[str] | None = None) -> Any:
    """Credentials for the chosen auth kind; ADC honours GOOGLE_APPLICATION_CREDENTIALS.

    ``scopes`` defaults to Compute's; the Cloud TPU modules ask for cloud-platform.
    """
    scopes = scopes or SCOPES
    if auth_kind == "anonymous":
        return AnonymousCredentials()
    if auth_kind == "serviceaccount":
        return service_account.Credentials.from_service_account_file(service_account_file, scopes=scopes)
    try:
        creds, _project = google.auth.default(scopes=scopes)
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise ValueError(
            "no Google Cloud credentials found: run `gcloud auth application-default login`, set "
            "GOOGLE_APPLICATION_CREDENTIALS, or use auth_kind=serviceaccount with service_account_file"
        ) from exc
    return creds


def make_clients(auth_kind: str, service_account_file: str | None, api_endpoint: str | None) -> Clients:
    """Clients that all share credentials and endpoint (so operation polling hits the same API)."""
    creds = credentials(auth_kind, service_account_file)
    options = ClientOptions(api_endpoint=api_endpoint) if api_endpoint else None

    def build(cls: Any) -> Any:
        return cls(credentials=creds, client_options=options, transport="rest")

    return Clients(
        instances=build(compute_v1.InstancesClient),
        disks=build(compute_v1.DisksClient),
        zone_operations=build(compute_v1.ZoneOperationsClient),
        firewalls=build(compute_v1.FirewallsClient),
        global_operations=build(compute_v1.GlobalOperationsClient),
    )


def to_dict(message: Any) -> dict[str, Any]:
    """A compute_v1 message as the REST JSON dict (camelCase keys), for diffing and results."""
    import json

    return json.loads(
        type(message).to_json(message, preserving_proto_field_name=False, use_integers_for_enums=False)
    )
