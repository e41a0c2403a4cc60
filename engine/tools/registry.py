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

KEY_PARAMETER = "idempotency_key"
"""The parameter a tool function declares to receive its call's key (engine.tools.ledger)."""
Handler = Callable[..., Any | Awaitable[Any]]
Formatter = Callable[[Any], str]
Lookup = Callable[[str], Any | Awaitable[Any]]
"""Asks the system behind a keyed tool what became of a key: the result the call had, or
``ledger.NOT_APPLIED``; raising means it cannot tell (engine.tools.recovery)."""

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_STARTS = 5
"""Starts of one call (by successive workers after crashes) before it may be given up."""
DEFAULT_CRASH_WINDOW_S = 60.0
"""And the time since its first start before it may be given up (engine.tools.recovery)."""
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
    """A tool an agent may call: its name, description and JSON Schema, the handler, and the
    policies the engine applies (roles, approval, timeout, retries, idempotency). ``@tool``
    builds one from a typed function."""

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
    "outcome unknown". ``@tool`` sets it when the function declares the parameter; a ``Tool``
    built from a JSON Schema must say so, and is refused if flag and handler disagree."""
    max_starts: int = DEFAULT_MAX_STARTS
    crash_window_s: float = DEFAULT_CRASH_WINDOW_S
    """A call re-run after crashes (idempotent or keyed) is given up only once it has been
    started ``max_starts`` times (each ``ToolCallStarted``) AND ``crash_window_s`` have passed
    since its first start: a tool that kills its worker stops, a storm of unrelated kills
    shorter than the window does not (engine.tools.recovery)."""
    lookup: Lookup | None = None
    """A keyed tool's way to ask its system about a key (``Lookup``): a call given up, or cut
    by a stop after a crash, is reported with what it says, and a call it knows applied is not
    run again."""
    validator: jsonschema.protocols.Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", frozenset(self.roles))
        object.__setattr__(self, "sensitivity", Sensitivity(self.sensitivity))
        if self.max_starts < 1:
            raise ConfigurationError(f"tool {self.name}: max_starts must be >= 1")
        if self.crash_window_s < 0:
            raise ConfigurationError(f"tool {self.name}: crash_window_s must be >= 0 seconds")
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
        check_key_wiring(self)

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
    crash_window_s: float = DEFAULT_CRASH_WINDOW_S,
    lookup: Lookup | None = None,
) -> Any:
    """Make a Tool from a typed function; usable as ``@tool`` or ``@tool(idempotent=True)``.
    A function that declares ``idempotency_key: str`` gets its call's key (engine.tools.ledger)."""

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
            crash_window_s=crash_window_s,
            lookup=lookup,
            takes_idempotency_key=KEY_PARAMETER in inspect.signature(func).parameters,
        )

    return build(fn) if fn is not None else build


def check_key_wiring(t: Tool) -> None:
    """Refuse a tool whose ``takes_idempotency_key`` and handler disagree (every call would fail
    with a TypeError, or the key would never reach the system), whose schema lets the model set
    the key, or whose ``lookup`` has no key to ask about."""
    declares, open_kwargs = _key_parameter(t.handler)
    if declares and not t.takes_idempotency_key:
        raise ConfigurationError(
            f"tool {t.name}: its handler declares {KEY_PARAMETER!r} but takes_idempotency_key is not set, "
            f"so every call would fail with a TypeError; pass takes_idempotency_key=True to Tool(...) (the "
            "engine then fills the key and re-runs the call with it after a crash), or remove the parameter"
        )
    if t.takes_idempotency_key and not (declares or open_kwargs):
        raise ConfigurationError(
            f"tool {t.name}: takes_idempotency_key=True but its handler has no {KEY_PARAMETER!r} parameter "
            f"to receive the key; add `{KEY_PARAMETER}: str` to the handler, or drop takes_idempotency_key"
        )
    if t.takes_idempotency_key and KEY_PARAMETER in t.parameters.get("properties", {}):
        raise ConfigurationError(
            f"tool {t.name}: {KEY_PARAMETER!r} is in its parameters schema, so the model would be asked "
            "for it; the engine fills it: remove it from the schema"
        )
    if t.lookup is not None:
        _check_lookup(t)


def _key_parameter(handler: Handler) -> tuple[bool, bool]:
    """Whether ``handler`` declares the key parameter, and whether it takes ``**kwargs``
    (a handler whose signature cannot be read is taken at its word)."""
    try:
        params = inspect.signature(handler).parameters
    except (TypeError, ValueError):
        return False, True
    return KEY_PARAMETER in params, any(p.kind is p.VAR_KEYWORD for p in params.values())


def _check_lookup(t: Tool) -> None:
    if not t.takes_idempotency_key:
        raise ConfigurationError(
            f"tool {t.name}: lookup= asks about a call's idempotency key, and this tool takes none; "
            f"give the handler an `{KEY_PARAMETER}: str` parameter (with Tool(...), also "
            "takes_idempotency_key=True), or drop lookup"
        )
    if not callable(t.lookup):
        raise ConfigurationError(f"tool {t.name}: lookup must be a function of the key, not {t.lookup!r}")
    try:
        inspect.signature(t.lookup).bind("key")
    except TypeError as exc:
        raise ConfigurationError(
            f"tool {t.name}: lookup must take the key as its one argument ({exc}); e.g. "
            "`async def lookup(key: str) -> Any` returning the call's result or NOT_APPLIED"
        ) from None
    except ValueError:
        pass  # a builtin whose signature cannot be read: called as it is


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
