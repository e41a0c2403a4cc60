"""Tool definitions: name, description, JSON Schema parameters, handler, formatter.

Tools come from typed Python functions (the schema is derived from the type hints with
pydantic, the description from the docstring) or from an explicit JSON Schema.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Awaitable, Callable, Iterable, Iterator, Mapping

import jsonschema
import pydantic

from ..errors import ConfigurationError
from .ledger import KEY_PARAMETER

Handler = Callable[..., Any | Awaitable[Any]]
Formatter = Callable[[Any], str]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_STARTS = 5
"""Times one call may be started (by successive workers after crashes) before it is abandoned."""
DEFAULT_MAX_RESULT_CHARS = 4000
"""Longest result text the model reads; longer ones are cut with a note (the log keeps it all)."""


class Sensitivity(StrEnum):
    """How much harm a wrong call can do (seed §4.1); shown with approval requests."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


def default_formatter(result: Any) -> str:
    """Compact JSON for structured results, the text itself for strings."""
    if isinstance(result, str):
        return result
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]
    """JSON Schema (an object schema) of the arguments."""
    handler: Handler
    timeout_s: float = DEFAULT_TIMEOUT_S
    idempotent: bool = False
    """Safe to run again with the same arguments: read-only lookups, upserts. Decides whether a
    timed-out or interrupted call is retried or reported as unknown outcome."""
    formatter: Formatter = default_formatter
    """Turns the structured result into the text the model reads."""
    arguments_model: type[pydantic.BaseModel] | None = None
    """When built from a function: converts validated JSON into typed Python arguments."""
    roles: frozenset[str] = frozenset()
    """Session roles that may use the tool; empty means every role. A session whose role is not
    listed never sees the tool, and a call naming it is answered as for an unknown tool."""
    sensitivity: Sensitivity = Sensitivity.LOW
    requires_approval: bool = False
    """Each call waits in PAUSED_FOR_USER until the user approves, edits or rejects it."""
    retries: int | None = None
    """Extra attempts after a timeout or crash; None means one for idempotent tools, else none."""
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS
    takes_idempotency_key: bool = False
    """The handler takes ``idempotency_key=``: the engine passes the call's key (engine.tools.ledger).
    That tells the engine the system behind the tool recognises a repeat of the key, so a call
    a crash interrupted is run again with the same key (exactly-once effect), never reported
    "outcome unknown"."""
    max_starts: int = DEFAULT_MAX_STARTS
    """Starts of one call (each ``ToolCallStarted``: the first, and one per worker that resumed
    it after a crash) before a call that is re-run after crashes is finished as abandoned."""
    validator: jsonschema.protocols.Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", frozenset(self.roles))
        object.__setattr__(self, "sensitivity", Sensitivity(self.sensitivity))
        if self.max_starts < 1:
            raise ConfigurationError(f"tool {self.name}: max_starts must be >= 1")
        if self.retries is not None and self.retries < 0:
            raise ConfigurationError(f"tool {self.name}: retries must be >= 0")
        if self.max_result_chars < 500:
            raise ConfigurationError(
                f"tool {self.name}: max_result_chars must be >= 500 (the truncation note alone is ~170)"
            )
        if not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigurationError(
                f"tool name {self.name!r} must be letters, digits, '_' or '-' (providers reject others)"
            )
        schema = dict(self.parameters)
        try:
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ConfigurationError(
                f"tool {self.name}: parameters are not a valid JSON Schema: {exc.message}"
            ) from exc
        if schema.get("type") != "object":
            raise ConfigurationError(f"tool {self.name}: parameters must be an object schema")
        object.__setattr__(self, "validator", cls(schema, format_checker=cls.FORMAT_CHECKER))
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.handler))

    @property
    def resumable(self) -> bool:
        """A call a crash interrupted may run again: the tool is idempotent, or the system behind
        it deduplicates by the call's idempotency key."""
        return self.idempotent or self.takes_idempotency_key

    @property
    def max_attempts(self) -> int:
        return 1 + (self.retries if self.retries is not None else int(self.idempotent))

    def allows(self, role: str) -> bool:
        return not self.roles or role in self.roles

    def spec(self) -> dict[str, Any]:
        """The definition a model is shown."""
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}


def tool(
    fn: Handler | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    idempotent: bool = False,
    formatter: Formatter = default_formatter,
    roles: Iterable[str] = (),
    sensitivity: Sensitivity | str = Sensitivity.LOW,
    requires_approval: bool = False,
    retries: int | None = None,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    max_starts: int = DEFAULT_MAX_STARTS,
) -> Any:
    """Make a Tool from a typed function; usable as ``@tool`` or ``@tool(idempotent=True)``."""

    def build(func: Handler) -> Tool:
        model = _arguments_model(func)
        schema = model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        doc = inspect.getdoc(func) or ""
        return Tool(
            name=name or func.__name__,
            description=description or doc,
            parameters=schema,
            handler=func,
            timeout_s=timeout_s,
            idempotent=idempotent,
            formatter=formatter,
            arguments_model=model,
            roles=frozenset(roles),
            sensitivity=Sensitivity(sensitivity),
            requires_approval=requires_approval,
            retries=retries,
            max_result_chars=max_result_chars,
            max_starts=max_starts,
            takes_idempotency_key=KEY_PARAMETER in inspect.signature(func).parameters,
        )

    return build(fn) if fn is not None else build


def _arguments_model(func: Handler) -> type[pydantic.BaseModel]:
    fields: dict[str, Any] = {}
    try:
        hints = inspect.get_annotations(func, eval_str=True)
    except NameError as exc:
        raise ConfigurationError(
            f"tool {func.__name__}: a type hint names something not importable at module level ({exc}); "
            "import the type at the top of the module"
        ) from exc
    for pname, param in inspect.signature(func).parameters.items():
        if pname == KEY_PARAMETER:
            if hints.get(pname) is not str:
                raise ConfigurationError(
                    f"tool {func.__name__}: {KEY_PARAMETER} is filled by the engine and must be typed str"
                )
            continue  # filled by the engine, not part of what the model is shown
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {func.__name__}: *args/**kwargs cannot be described to a model")
        if pname not in hints:
            raise ConfigurationError(f"tool {func.__name__}: parameter {pname!r} needs a type hint")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], default)
    config = pydantic.ConfigDict(extra="forbid")
    return pydantic.create_model(f"{func.__name__}_arguments", __config__=config, **fields)


class ToolRegistry:
    """The tools an agent may use, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, t: Tool) -> Tool:
        if not isinstance(t, Tool):
            raise ConfigurationError(f"{t!r} is not a Tool; decorate the function with @tool")
        if t.name in self._tools:
            raise ConfigurationError(f"tool {t.name!r} is registered twice")
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self._tools.values()]

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))
