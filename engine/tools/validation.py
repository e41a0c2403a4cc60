"""Turn a model's raw tool arguments into validated Python arguments, or into a correction the
model can act on ("end_date must be YYYY-MM-DD, got '2025/1/15'") -- seed §4.4."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema
import pydantic

from .registry import Tool

FORMAT_HINTS = {
    "date": "YYYY-MM-DD",
    "date-time": "an ISO 8601 date-time such as 2025-01-15T09:30:00Z",
    "time": "HH:MM:SS",
    "email": "an email address",
    "uri": "an absolute URI",
    "uuid": "a UUID",
}
TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


@dataclass(frozen=True, slots=True)
class ArgumentProblem:
    """Why arguments were refused, phrased for the model."""

    problems: tuple[str, ...]

    def describe(self) -> str:
        return "; ".join(self.problems)


def parse_arguments(t: Tool, arguments_json: str) -> dict[str, Any] | ArgumentProblem:
    """Parse and validate; return keyword arguments for the handler or the problems found.

    Tools built from typed functions take a fast path: pydantic parses and validates the JSON
    in one strict pass. Only when that fails is the slower JSON Schema validation run, to phrase
    the problems for the model.
    """
    if t.arguments_model is not None:
        try:
            return dict(t.arguments_model.model_validate_json(arguments_json or "{}", strict=True))
        except pydantic.ValidationError:
            pass
    try:
        raw = json.loads(arguments_json) if arguments_json.strip() else {}
    except json.JSONDecodeError as exc:
        shown = arguments_json if len(arguments_json) <= 200 else arguments_json[:200] + "..."
        return ArgumentProblem(
            (f"arguments are not valid JSON ({exc.msg} at position {exc.pos}); you sent: {shown}",)
        )
    except RecursionError:
        return ArgumentProblem(
            (f"arguments are nested too deeply to read; you sent: {arguments_json[:200]}...",)
        )
    if not isinstance(raw, dict):
        return ArgumentProblem(
            (f"arguments must be a JSON object of named arguments, got {type(raw).__name__} {_short(raw)}",)
        )
    errors = sorted(
        t.validator.iter_errors(raw), key=lambda e: ([str(p) for p in e.absolute_path], str(e.validator))
    )
    if errors:
        # one 'required' error per missing name, each describing all of them: keep one copy
        return ArgumentProblem(tuple(dict.fromkeys(describe_error(e, t) for e in errors)))
    if t.arguments_model is None:
        return raw
    try:
        return dict(t.arguments_model.model_validate(raw))
    except pydantic.ValidationError as exc:
        return ArgumentProblem(
            tuple(f"{_loc(err['loc'])}: {err['msg']}, got {_short(err.get('input'))}" for err in exc.errors())
        )


def describe_error(error: jsonschema.ValidationError, t: Tool) -> str:
    path = _loc(error.absolute_path) or "arguments"
    kind, value, spec = error.validator, error.instance, error.validator_value
    if kind == "format":
        return f"{path} must be {FORMAT_HINTS.get(str(spec), 'a valid ' + str(spec))}, got {_short(value)}"
    if kind == "required":
        missing = [name for name in spec if isinstance(value, dict) and name not in value]
        props = error.schema.get("properties", {})
        wanted = ", ".join(f"{name} ({_expected(props.get(name))})" for name in missing)
        sent = ", ".join(map(str, value)) if isinstance(value, dict) and value else "none"
        return f"missing required argument {wanted}; arguments you sent: {sent}"
    if kind == "additionalProperties":
        allowed = ", ".join(t.parameters.get("properties", {})) or "none"
        extra = sorted(set(value) - set(error.schema.get("properties", {})))
        sent = ", ".join(f"{name}={_short(value[name])}" for name in extra)
        return f"unknown argument {sent}; allowed arguments are {allowed}"
    if kind == "type":
        wanted = " or ".join(TYPE_NAMES.get(s, s) for s in ([spec] if isinstance(spec, str) else spec))
        return f"{path} must be {wanted}, got {_short(value)}"
    if kind == "enum":
        return f"{path} must be one of {', '.join(map(repr, spec))}, got {_short(value)}"
    if kind == "pattern":
        return f"{path} must match the pattern {spec}, got {_short(value)}"
    return f"{path}: {error.message}"


def _expected(schema: Any) -> str:
    """What a property schema asks for, in words: "YYYY-MM-DD", "one of 'eu', 'us'", "a string"."""
    if not isinstance(schema, dict):
        return "any value"
    if "format" in schema:
        return FORMAT_HINTS.get(str(schema["format"]), f"a valid {schema['format']}")
    if "enum" in schema:
        return "one of " + ", ".join(map(repr, schema["enum"]))
    kinds = schema.get("type")
    if isinstance(kinds, str):
        return TYPE_NAMES.get(kinds, kinds)
    if isinstance(kinds, list):
        return " or ".join(TYPE_NAMES.get(str(k), str(k)) for k in kinds)
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list):
        return " or ".join(_expected(o) for o in options)
    return "any value"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _loc(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
