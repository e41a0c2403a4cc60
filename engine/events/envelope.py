"""The envelope every event carries, and the ids and times it is made with.

``quick_init`` gives an event class a faster ``__init__``; engine.events applies it to every
class in ``EVENT_TYPES`` once they are all defined.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

_IDS_PER_READ = 256
_ids: list[str] = []
"""Random ids read ahead: one ``os.urandom`` call (a system call) serves 256 of them, and a
model step makes about ten (bench/README.md §1). ``list.pop`` and ``extend`` are atomic, so
threads share it safely; a forked child starts with none (it would repeat the parent's)."""
os.register_at_fork(after_in_child=_ids.clear)


def new_id() -> str:
    """A random 128-bit id as 32 hex characters (the shape of ``uuid4().hex``, for less)."""
    try:
        return _ids.pop()
    except IndexError:
        raw = os.urandom(16 * _IDS_PER_READ).hex()
        _ids.extend([raw[i : i + 32] for i in range(0, len(raw), 32)])
        return _ids.pop()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Envelope shared by every event."""

    session_id: str
    """The session this event belongs to; also the partition key."""
    version: int
    """Per-session sequence number, 1 for SessionCreated, +1 per event, no gaps."""
    event_id: str = field(default_factory=new_id)
    time_ms: int = field(default_factory=now_ms)
    """Wall-clock time the producer created the event, ms since the epoch."""
    causation_id: str | None = None
    """event_id of the event that caused this one (e.g. the user message behind a turn)."""
    correlation_id: str | None = None
    """Groups the events of one unit of work; the turn id inside a turn."""
    producer: str = "turnlog"
    """Who wrote it: a worker id, "api", "cli", an admin tool."""
    basis_version: int = 0
    """The session version its producer had read when it decided this event: a step's events
    carry the version the step was decided from, which is below ``version - 1`` when user
    messages slipped in between and the step was rebased over them. 0: not recorded (events
    written before this field existed)."""

    type: ClassVar[str] = "Event"


E = TypeVar("E", bound=Event)


def quick_init(cls: type[Event]) -> None:
    """Give an event class an ``__init__`` that sets its slots through their descriptors.

    A frozen dataclass's generated ``__init__`` goes through ``object.__setattr__`` per field;
    this one takes the same keyword-only arguments with the same defaults and factories, and
    costs about half (an event is made for every step of every turn). Only for slotted,
    keyword-only classes with nothing to run after init; tests/test_events checks it.
    """
    fields = dataclasses.fields(cls)
    if "__slots__" not in vars(cls) or hasattr(cls, "__post_init__") or not all(f.kw_only for f in fields):
        raise TypeError(f"{cls.__name__}: not a slotted keyword-only event dataclass")
    scope: dict[str, object] = {"_MISSING": dataclasses.MISSING}
    params, body = [], []
    for f in fields:
        scope[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        value = f.name
        if f.default is not dataclasses.MISSING:
            scope[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            scope[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            value = f"_factory_{f.name}() if {f.name} is _MISSING else {f.name}"
        else:
            params.append(f.name)
        body.append(f"    _set_{f.name}(self, {value})")
    source = f"def __init__(self, *, {', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(compile(source, f"<{cls.__name__}.__init__>", "exec"), scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    setattr(cls, "__init__", init)  # noqa: B010 - a class attribute, replaced on purpose
