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
    if not isinstance(raw, dict):
        return ArgumentProblem((f"arguments must be a JSON object, got {type(raw).__name__}",))
    errors = sorted(t.validator.iter_errors(raw), key=lambda e: (list(e.absolute_path), e.validator))
    if errors:
        # one 'required' error per missing name, each describing all of them: keep one copy
        return ArgumentProblem(tuple(dict.fromkeys(describe_error(e, t) for e in errors)))
    if t.arguments_model is None:
        return raw
    try:
        return dict(t.arguments_model.model_validate(raw))
    except pydantic.ValidationError as exc:
        return ArgumentProblem(
            tuple(f"{_loc(err['loc'])}: {err['msg']}, got {err.get('input')!r}" for err in exc.errors())
        )


def describe_error(error: jsonschema.ValidationError, t: Tool) -> str:
    path = _loc(error.absolute_path) or "arguments"
    kind, value, spec = error.validator, error.instance, error.validator_value
    if kind == "format":
        return f"{path} must be {FORMAT_HINTS.get(str(spec), 'a valid ' + str(spec))}, got {value!r}"
    if kind == "required":
        missing = [name for name in spec if isinstance(value, dict) and name not in value]
        return "missing required argument " + ", ".join(missing)
    if kind == "additionalProperties":
        allowed = ", ".join(t.parameters.get("properties", {})) or "none"
        extra = sorted(set(value) - set(error.schema.get("properties", {})))
        return f"unknown argument {', '.join(extra)}; allowed arguments are {allowed}"
    if kind == "type":
        wanted = " or ".join(TYPE_NAMES.get(s, s) for s in ([spec] if isinstance(spec, str) else spec))
        return f"{path} must be {wanted}, got {value!r}"
    if kind == "enum":
        return f"{path} must be one of {', '.join(map(repr, spec))}, got {value!r}"
    if kind == "pattern":
        return f"{path} must match the pattern {spec}, got {value!r}"
    return f"{path}: {error.message}"


def _loc(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
