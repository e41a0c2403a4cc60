"""Structured task state (second seed §4.2): the facts of a task being refined over turns.

An agent declares the state as a pydantic model whose fields all have defaults (the filters of
a report: date range, group-by, metrics). The model changes it through the built-in
``update_task_state`` tool with three operations:

* ``set``: replace the named fields; a new group-by replaces the old one, it is not appended;
* ``overwrite``: replace the whole state (fields not given take their defaults);
* ``reset``: back to the defaults.

Each change is a ``TaskStateChanged`` event carrying the change as a JSON Patch (RFC 6902, the
shape of AG-UI's STATE_DELTA) and the whole state after it. The state is shown to the model in
every context.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pydantic

from ..errors import ConfigurationError, ToolFailure

Op = Literal["set", "overwrite", "reset"]
OPS: tuple[str, ...] = ("set", "overwrite", "reset")


def defaults(schema: type[pydantic.BaseModel]) -> dict[str, Any]:
    try:
        return schema().model_dump(mode="json")
    except pydantic.ValidationError as exc:
        raise ConfigurationError(
            f"task state {schema.__name__}: every field needs a default (the state starts empty): {exc}"
        ) from exc


def apply(
    schema: type[pydantic.BaseModel], current: dict[str, Any], op: str, values: dict[str, Any]
) -> dict[str, Any]:
    """The state after ``op``; raises ToolFailure naming the field (the model reads it)."""
    if op == "reset":
        return defaults(schema)
    if op == "set":
        unknown = sorted(set(values) - set(schema.model_fields))
        if unknown:
            known = ", ".join(schema.model_fields)
            raise ToolFailure(f"the task state has no field {unknown[0]!r}; its fields are {known}")
        base = {**(current or defaults(schema)), **values}
    elif op == "overwrite":
        base = dict(values)
    else:
        raise ToolFailure(f"op must be one of {', '.join(OPS)}, not {op!r}")
    try:
        return schema.model_validate(base).model_dump(mode="json")
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "state"
        raise ToolFailure(f"task state field {where}: {first['msg']}") from None


def json_patch(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """RFC 6902 operations turning ``before`` into ``after``, field by field."""
    ops: list[dict[str, Any]] = []
    for key in before:
        if key not in after:
            ops.append({"op": "remove", "path": _path(key)})
    for key, value in after.items():
        if key not in before:
            ops.append({"op": "add", "path": _path(key), "value": value})
        elif before[key] != value:
            ops.append({"op": "replace", "path": _path(key), "value": value})
    return ops


def _path(key: str) -> str:
    return "/" + key.replace("~", "~0").replace("/", "~1")


def tool_parameters(schema: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The update tool's JSON Schema: the op, and the state's fields as optional values."""
    fields = schema.model_json_schema()
    properties = {
        k: {kk: vv for kk, vv in v.items() if kk != "title"} for k, v in fields.get("properties", {}).items()
    }
    values: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if "$defs" in fields:
        values["$defs"] = fields["$defs"]
    return {
        "type": "object",
        "properties": {
            "op": {
                "type": "string",
                "enum": list(OPS),
                "description": "set: replace the named fields; "
                "overwrite: replace the whole state; reset: back to the defaults",
            },
            "values": values,
        },
        "required": ["op"],
        "additionalProperties": False,
    }


def render(state: dict[str, Any]) -> str:
    return (
        "Current task state (change it with update_task_state; set replaces the fields you name):\n"
        + json.dumps(state, ensure_ascii=False, sort_keys=True)
    )
