"""Every answer of the fake TPU API, parsed with the released client's types before it is sent.

A fake that answers what the real service cannot (a misspelt field, an enum value that does not
exist, a string where an object goes) lets the module pass against it and fail against the world.
So server.py runs each answer through ``check`` with the type the REST reference gives that
method, with unknown fields refused; an answer that does not parse becomes an HTTP 500 naming the
field, which fails whatever test sent the request.

google-cloud-tpu 1.28.0 has no flex-start fields (``provisioningModel``, ``runDuration``) in its
v2alpha1 ``QueuedResource``; the fake carries them as gcloud sends them (docs/tpu.md, "Which API"),
so they are checked here by hand and taken out before the rest is parsed.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from google.cloud import tpu_v2, tpu_v2alpha1
from google.longrunning import operations_pb2
from google.protobuf import json_format
from google.rpc import (
    error_details_pb2,  # noqa: F401 - puts QuotaFailure and ErrorInfo in the pool
    status_pb2,  # for the Any-typed details of an error body
)

FLEX_MODELS = frozenset({"PROVISIONING_MODEL_UNSPECIFIED", "STANDARD", "SPOT", "FLEX_START"})
_DURATION = re.compile(r"\d+(?:\.\d{1,9})?s")
QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2alpha1.QueuedResource"


class StrictError(Exception):
    """The fake's answer does not parse as the type the real service answers with."""


def _without_flex(resource: dict[str, Any]) -> dict[str, Any]:
    """The queued resource less the two flex-start fields, after checking their values."""
    rest = dict(resource)
    model = rest.pop("provisioningModel", None)
    run = rest.pop("runDuration", None)
    if model is not None and model not in FLEX_MODELS:
        raise StrictError(f"provisioningModel {model!r} is not one of {sorted(FLEX_MODELS)}")
    if run is not None:
        if not isinstance(run, dict) or set(run) != {"maxRunDuration"}:
            raise StrictError(f"runDuration {run!r} must be {{'maxRunDuration': '<seconds>s'}}")
        if not _DURATION.fullmatch(str(run["maxRunDuration"])):
            raise StrictError(f"runDuration.maxRunDuration {run['maxRunDuration']!r} is not a duration")
    return rest


def _parse(message_type: Any, body: dict[str, Any]) -> None:
    try:
        message_type.from_json(json.dumps(body), ignore_unknown_fields=False)
    except Exception as exc:
        raise StrictError(f"not a {message_type.__qualname__}: {exc}") from exc


def _parse_pb(message: Any, body: dict[str, Any]) -> None:
    try:
        json_format.ParseDict(body, message, ignore_unknown_fields=False)
    except Exception as exc:
        raise StrictError(f"not a {message.DESCRIPTOR.full_name}: {exc}") from exc


def check(handler: str, version: str, status: int, answer: Any) -> None:
    """Raise StrictError unless ``answer`` is what the real method answers with."""
    if status >= 400:
        error = dict(answer.get("error") or {})
        if set(error) != {"code", "message", "status", "details"}:
            raise StrictError(f"an error body has error.code, message, status and details: {sorted(error)}")
        error.pop("status")
        _parse_pb(status_pb2.Status(), error)
        return
    if handler == "get_queued":
        _parse(tpu_v2alpha1.QueuedResource, _without_flex(answer))
    elif handler == "get_node":
        _parse(tpu_v2alpha1.Node if version == "v2alpha1" else tpu_v2.Node, answer)
    elif handler == "get_guest_attributes":
        _parse(tpu_v2.GetGuestAttributesResponse, answer)
    else:  # create_queued, delete_queued, delete_node, get_operation: a long-running operation
        op = copy.deepcopy(answer)
        if (op.get("response") or {}).get("@type") == QR_TYPE:
            op["response"] = dict(_without_flex(op["response"]), **{"@type": QR_TYPE})
        _parse_pb(operations_pb2.Operation(), op)
