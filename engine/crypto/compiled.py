"""Sealing and opening an event, compiled per event type: one generated function copies the
event and seals (or opens) its content fields in the same pass, the associated data's common
start built once. A persisting log runs it for every event it writes or reads, so it avoids the
generic loop and the copy after it (about half of the cost per event).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..events import Event, ToolCallSpec
from .fields import CONTENT, ERASED, TWINS
from .sealed import PREFIX, REF, open_sealed, seal

Key = AESGCM | Callable[[], AESGCM | None] | None
"""The session's key; or what finds it (called at the first sealed value: a log written before
encryption has none, and needs no key); or None, the key is gone: sealed values read erased."""
Sealer = Callable[[Event, AESGCM], Event]
Opener = Callable[[Event, Key], Event]


def _where(event: Event, field: str) -> str:
    return f"{event.type} v{event.version} of session {event.session_id}, field {field}"


def _open(key: Key, value: str, head: bytes, field: str, event: Event, erased: str) -> str:
    if not value.startswith(PREFIX):
        return value  # written before encryption
    if key is not None and not isinstance(key, AESGCM):
        key = key()
    if key is None:
        return erased
    return open_sealed(key, value, head + field.encode(), _where(event, field))


def _twin(key: Key, opened: str, erased: str) -> str:
    """A field sealed as a reference to its twin (fields.TWINS): the twin's opened value, or the
    field's own erased value once the key is gone."""
    if key is not None and not isinstance(key, AESGCM):
        key = key()
    return erased if key is None else opened


def _seal_calls(
    aead: AESGCM, calls: tuple[ToolCallSpec, ...], head: bytes, name: str
) -> tuple[ToolCallSpec, ...]:
    return tuple(
        ToolCallSpec(c.call_id, c.name, seal(aead, c.arguments_json, head + f"{name}.{i}".encode()))
        if c.arguments_json
        else c
        for i, c in enumerate(calls)
    )


def _open_calls(
    aead: Key, calls: tuple[ToolCallSpec, ...], head: bytes, name: str, event: Event
) -> tuple[ToolCallSpec, ...]:
    erased = ERASED["calls"]
    return tuple(
        ToolCallSpec(c.call_id, c.name, _open(aead, c.arguments_json, head, f"{name}.{i}", event, erased))
        for i, c in enumerate(calls)
    )


def _compile(cls: type[Event], direction: str) -> Callable[..., Event]:
    """``direction`` seal: ``f(event, aead)``; open: ``f(event, aead_or_none)``."""
    content, twins = CONTENT[cls.type], TWINS.get(cls.type, {})
    scope: dict[str, Any] = {
        "_new": object.__new__, "_cls": cls, "_seal": seal, "_open": _open,
        "_seal_calls": _seal_calls, "_open_calls": _open_calls, "_ERASED": ERASED, "_twin": _twin,
    }  # fmt: skip
    lines = [
        "def f(e, aead):",
        f"    head = f'{{e.session_id}}\\x1f{{e.event_id}}\\x1f{cls.type}.'.encode()",
        "    n = _new(_cls)",
    ]
    for f in dataclasses.fields(cls):
        scope[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        shape = content.get(f.name)
        value = f"e.{f.name}"
        twin = twins.get(f.name)
        if twin is not None and direction == "seal":
            ref = REF + twin
            value = f"{ref!r} if (v := e.{f.name}) and v == e.{twin} else " + _sealed_value(f.name)
        elif twin is not None:  # its twin comes first in the event: opened already, in n
            erased = f"_ERASED[{shape!r}]"
            value = f"_twin(aead, n.{twin}, {erased}) if e.{f.name} == {REF + twin!r} else " + _opened_value(
                f.name, shape
            )
        elif shape == "calls" and direction == "seal":
            value = f"_seal_calls(aead, v, head, {f.name!r}) if (v := e.{f.name}) else v"
        elif shape == "calls":
            value = f"_open_calls(aead, v, head, {f.name!r}, e) if (v := e.{f.name}) else v"
        elif shape is not None and direction == "seal":
            value = _sealed_value(f.name)
        elif shape is not None:
            value = _opened_value(f.name, shape)
        lines.append(f"    _set_{f.name}(n, {value})")
    lines.append("    return n")
    exec(compile("\n".join(lines) + "\n", f"<{direction} {cls.type}>", "exec"), scope)  # noqa: S102
    made: Callable[..., Event] = scope["f"]
    return made


def _sealed_value(name: str) -> str:
    return f"_seal(aead, v, head + {name.encode()!r}) if (v := e.{name}) else v"


def _opened_value(name: str, shape: str | None) -> str:
    return f"_open(aead, v, head, {name!r}, e, _ERASED[{shape!r}]) if (v := e.{name}) else v"


_SEALERS: dict[type[Event], Sealer] = {}
_OPENERS: dict[type[Event], Opener] = {}


def sealer_of(cls: type[Event]) -> Sealer:
    """The compiled sealer of an event type with content (``CONTENT`` names it)."""
    made = _SEALERS.get(cls)
    if made is None:
        made = _SEALERS[cls] = _compile(cls, "seal")
    return made


def opener_of(cls: type[Event]) -> Opener:
    made = _OPENERS.get(cls)
    if made is None:
        made = _OPENERS[cls] = _compile(cls, "open")
    return made
