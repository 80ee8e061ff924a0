"""The fake's answers held to the real API's types before they leave: a misspelt field fails loudly.

The released client (google-cloud-compute) ignores fields it does not know, so a fake that answered
``statuss`` or ``"id": 123`` would pass every test and prove nothing. Every JSON body the fake
sends goes through ``check``:

- a resource or operation is parsed with the client's own message type (``compute_v1.Instance``,
  ``Operation``, ...) with ``ignore_unknown_fields=False``, then walked field by field against the
  type's descriptor, holding it to the JSON the API writes (the proto3 JSON mapping,
  https://protobuf.dev/programming-guides/json/): camelCase names only (``Parse`` also takes
  ``machine_type``), 64-bit integers as strings, no empty lists or maps (the API leaves them out),
  and a value of one of the type's own enum names where the field has one (``Instance.Status``:
  ``status`` is a plain string in the proto, so the client would take ``"RUNING"``);
- an error is held to the JSON error format the API documents
  (https://cloud.google.com/apis/design/errors#http_mapping): ``{"error": {"code", "message",
  "errors": [{"message", "domain", "reason"}], "status"?, "details"?}}``, with ``code`` the HTTP
  status, as Compute Engine answers (a 404 in full:
  https://github.com/GoogleCloudPlatform/magic-modules/pull/4377).

A body that fails is not sent: the server answers 500 naming the field, and logs it.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

# The answer's type for each route handler of server.py; anything else answers an Operation.
RESPONSE_TYPES = {
    "get_instance": "Instance",
    "list_instances": "InstanceList",
    "get_disk": "Disk",
    "get_firewall": "Firewall",
    "get_guest_attributes": "GuestAttributes",
    "list_operations": "OperationList",
}
_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}
_INT32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_SFIXED32,
}
_FLOAT = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}
# google.rpc.Code names: what an error's optional "status" may say.
_RPC_STATUS = frozenset(
    {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
     "PERMISSION_DENIED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
     "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)  # fmt: skip
_ERROR_KEYS = frozenset({"code", "message", "errors", "status", "details"})
# The legacy errors[] entries: domain, reason and message always; the rest where the API has them.
_ERROR_ITEM_KEYS = frozenset({"domain", "reason", "message", "location", "locationType", "extendedHelp"})


class ResponseMismatch(Exception):
    """A body the real API would never send: names the field and what is wrong with it."""


def response_type(handler: str) -> str:
    """The compute_v1 message name a route handler answers with."""
    return RESPONSE_TYPES.get(handler, "Operation")


@functools.cache
def _message_class(name: str) -> Any:
    from google.cloud import compute_v1

    return getattr(compute_v1, name)


@functools.cache
def _fields(descriptor: Descriptor) -> dict[str, FieldDescriptor]:
    """A message's fields by the JSON name the API writes (cached: the walk runs on every answer)."""
    return {f.json_name: f for f in descriptor.fields}


@functools.cache
def _enum_names(descriptor: Descriptor, field_name: str) -> frozenset[str] | None:
    """Allowed values of a string field that has a nested enum of its name (status -> Status)."""
    camel = "".join(part.capitalize() for part in field_name.split("_"))
    enum = descriptor.enum_types_by_name.get(camel)
    if enum is None:
        return None
    return frozenset(v.name for v in enum.values if not v.name.startswith("UNDEFINED_"))


def check_message(name: str, body: Any) -> None:
    """Raise ResponseMismatch unless ``body`` is JSON the API could send as a ``name``."""
    from google.protobuf import json_format

    cls = _message_class(name)
    if not isinstance(body, dict):
        raise ResponseMismatch(f"{name}: the body is {type(body).__name__}, not an object")
    try:
        cls.from_json(json.dumps(body), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise ResponseMismatch(f"{name}: {str(exc).splitlines()[0]}") from exc
    _walk(cls.pb().DESCRIPTOR, body, name)
    kind = body.get("kind")
    wanted = "compute#" + name[0].lower() + name[1:]
    if kind is not None and kind != wanted:
        raise ResponseMismatch(f"{name}.kind: {kind!r}, the API says {wanted!r}")


def _walk(descriptor: Descriptor, body: dict[str, Any], path: str) -> None:
    fields = _fields(descriptor)
    for key, value in body.items():
        where = f"{path}.{key}"
        field = fields.get(key)
        if field is None:  # Parse took it, so it is the proto name: the API never writes that
            raise ResponseMismatch(f"{where}: not a JSON field name of {descriptor.name} (camelCase)")
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if not isinstance(value, dict) or not value:
                raise ResponseMismatch(f"{where}: an empty map, which the API leaves out")
            value_field = field.message_type.fields_by_name["value"]
            for map_key, item in value.items():
                _value(descriptor, value_field, item, f"{where}[{map_key!r}]")
            continue
        if field.is_repeated:
            if not isinstance(value, list) or not value:
                raise ResponseMismatch(f"{where}: an empty list, which the API leaves out")
            for index, item in enumerate(value):
                _value(descriptor, field, item, f"{where}[{index}]")
            continue
        _value(descriptor, field, value, where)


def _value(parent: Descriptor, field: FieldDescriptor, value: Any, where: str) -> None:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        if not isinstance(value, dict):
            raise ResponseMismatch(f"{where}: {value!r} is not an object")
        _walk(field.message_type, value, where)
    elif kind in _INT64:
        if not (isinstance(value, str) and re.fullmatch(r"-?\d+", value)):
            raise ResponseMismatch(f"{where}: {value!r}; the API writes 64-bit integers as JSON strings")
    elif kind in _INT32:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ResponseMismatch(f"{where}: {value!r} is not a JSON integer")
    elif kind in _FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ResponseMismatch(f"{where}: {value!r} is not a JSON number")
    elif kind == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise ResponseMismatch(f"{where}: {value!r} is not true or false")
    elif kind == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            raise ResponseMismatch(f"{where}: {value!r} is not a string")
        allowed = _enum_names(parent, field.name)
        if allowed is not None and value not in allowed:
            raise ResponseMismatch(f"{where}: {value!r} is none of {parent.name}'s {sorted(allowed)}")


def check_error(status: int, body: Any) -> None:
    """Raise ResponseMismatch unless ``body`` is the API's JSON error for HTTP ``status``."""
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        raise ResponseMismatch(f"error body: {body!r} is not {{'error': {{...}}}}")
    error = body["error"]
    unknown = set(error) - _ERROR_KEYS
    if unknown:
        raise ResponseMismatch(f"error.{sorted(unknown)[0]}: not a field of the API's error")
    if error.get("code") != status:
        raise ResponseMismatch(f"error.code: {error.get('code')!r}, the HTTP status is {status}")
    message = error.get("message")
    if not isinstance(message, str) or not message:
        raise ResponseMismatch(f"error.message: {message!r} is not a message")
    if "status" in error and error["status"] not in _RPC_STATUS:
        raise ResponseMismatch(f"error.status: {error['status']!r} is not a google.rpc.Code name")
    items = error.get("errors")
    if not isinstance(items, list) or not items:
        raise ResponseMismatch("error.errors: Compute Engine always lists the errors")
    for index, item in enumerate(items):
        where = f"error.errors[{index}]"
        if not isinstance(item, dict):
            raise ResponseMismatch(f"{where}: {item!r} is not an object")
        unknown = set(item) - _ERROR_ITEM_KEYS
        if unknown:
            raise ResponseMismatch(f"{where}.{sorted(unknown)[0]}: not a field of an API error entry")
        for key in ("domain", "reason", "message"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise ResponseMismatch(f"{where}.{key}: {item.get(key)!r} is missing or not a string")
    if items[0]["message"] != message:
        raise ResponseMismatch("error.errors[0].message: differs from error.message; the API repeats it")


def check(handler: str | None, status: int, body: Any) -> None:
    """Check one answer of the fake: an error by its shape, anything else by its handler's type."""
    from tests.fake_compute import iam

    if handler in iam.HANDLERS:  # Resource Manager's shapes are not Compute's
        iam.check(handler, status, body)
    elif status >= 400:
        check_error(status, body)
    elif handler is None:
        raise ResponseMismatch(f"a {status} answer from no route")
    else:
        check_message(response_type(handler), body)
