"""What a Kafka log process holds of a partition, weighed: the memory bound of ``kafka_index``.

A process's index of a partition keeps two things: the window (the partition's latest records
in offset order, what the consumers near the end read) and each loaded session's records (what
reads of a session, the owner's version checks and its admissions fold). Unbounded, both grow
with the partition's history for as long as the process runs: about a kilobyte a record, two
dozen records a turn. So the index weighs what it holds (``record_bytes``) and, past its budget,
``PartitionIndex.trim`` keeps the newest quarter of the budget as the window (a read below the
window's base goes to Kafka: ``kafka_reader.before_base``), and unloads sessions at rest not
written since the window's base, least recently written first, until it holds half the budget:
each one's ``SessionEntry`` (version, closed, runs) stays, and the session is read again from
its runs the next time something uses it, as after a takeover from the session index
(``kafka_sessions``). A live session (a turn running, messages waiting, not at rest), one that
poison names and one its caller keeps (the transaction just committed) are never unloaded.

Every caller that awaits between loading a session and using it loads it again (a trim may run
in between): ``load`` is free for a loaded session. ``HeldCounts`` tells an operator whether the
budget holds the sessions in use at once: below it, a process reads back about as many sessions
as it unloads, over and over (its /metrics: consumers/log_metrics.py).
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from typing import Any, Callable, Sequence

DEFAULT_INDEX_BYTES = 256 * 1024 * 1024
"""What a process holds of the log's partitions by default, all partitions together."""
UNBOUNDED = sys.maxsize
RECORD_BYTES = 700
"""A held record's fixed cost beyond its text: the LogRecord and event objects, their small
fields, the record's slots in the index's lists and its fold's share (tracemalloc: a text
message of 400 characters holds about 1.1 kB: bench/README.md §12)."""
WINDOW_SHARE = 4
"""The window keeps 1/WINDOW_SHARE of the budget: the rest is the loaded sessions' older records."""


@dataclasses.dataclass
class HeldCounts:
    """Sessions a process's partition indexes unloaded, and read back from their runs (after an
    unload, or named by the session index at a takeover), all partitions together, since it
    started."""

    unloaded: int = 0
    loaded: int = 0


@dataclasses.dataclass(frozen=True)
class HeldUse:
    """What a process holds of the log's partitions now, against its budget (``index_bytes``)."""

    held_bytes: int
    budget_bytes: int
    counts: HeldCounts


_TEXTS: dict[type, tuple[Callable[[Any], tuple[Any, ...]], Callable[[Any], tuple[Any, ...]]]] = {}
"""Each dataclass type's getters of its fields that may hold text: the strings, the tuples."""


def record_bytes(event: Any) -> int:
    """An estimate of the memory an indexed event keeps alive: its text plus a fixed cost."""
    return RECORD_BYTES + _text_bytes(event)


def _text_bytes(value: Any) -> int:
    getters = _TEXTS.get(type(value))
    if getters is None:
        getters = _TEXTS[type(value)] = _getters(type(value))
    strings, tuples = getters
    size = sum(map(len, filter(None, strings(value))))
    for items in tuples(value):
        size += sum(_text_bytes(item) for item in items if dataclasses.is_dataclass(item))
    return size


def _getters(kind: type) -> tuple[Callable[[Any], tuple[Any, ...]], Callable[[Any], tuple[Any, ...]]]:
    """Getters of ``kind``'s string fields and tuple fields, each as a tuple of values."""
    fields = dataclasses.fields(kind)
    strings = [f.name for f in fields if str(f.type).startswith("str")]
    tuples = [f.name for f in fields if str(f.type).startswith("tuple")]
    return _all(strings), _all(tuples)


def _all(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """A getter of the fields ``names`` as one tuple (``attrgetter`` returns a bare value for one)."""
    if not names:
        return lambda value: ()
    getter = operator.attrgetter(*names)
    return getter if len(names) > 1 else lambda value: (getter(value),)


def window_start(weights: Sequence[int], keep: int) -> int:
    """The index of the first of the latest records that fit in ``keep`` bytes together."""
    held, i = 0, len(weights)
    while i > 0 and held + weights[i - 1] <= keep:
        i -= 1
        held += weights[i]
    return i


def index_budget(total_bytes: int, partitions: int) -> int:
    """Each partition's share of what a process holds (a process may read every partition)."""
    return max(1, total_bytes // max(1, partitions))
