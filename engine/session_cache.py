"""What a turn runner keeps of each session between its turns, bounded by memory.

A worker keeps, per session it served, the folded state (so the next turn reads only the events
appended since), the snapshot encoder's encoded messages, and the context manager's token counts
and trim index. A bound by count (so many sessions) says nothing about memory: a thousand long
sessions may take gigabytes, ten thousand short ones a few megabytes. This cache bounds what it
holds by an estimate of the bytes each entry keeps alive (``history_bytes``: the messages' text
plus a fixed cost per message object), and evicts whole sessions, least recently used first, so
no part of a session (a token tally, a trim index) outlives the state whose messages it points
to. The session in use is never evicted to make room for itself: a session larger than the
whole budget stays until the next one is used.

Each turn runner has one (``TurnRunner(cache_bytes=...)``, also on ``TurnWorker`` and
``AgentSessions``), shared by its snapshot encoder and context manager; a gateway that runs turns
has two, its API's and its worker's. What a cached idle session costs a worker is measured in
bench/README.md §12.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Generic, Sequence, TypeVar, cast

from .messages import ChatMessage

V = TypeVar("V")

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
"""What a runner keeps of idle sessions by default: a few thousand long sessions, or every
session of a worker holding ten thousand short turns."""
MESSAGE_BYTES = 400
"""A cached message's fixed cost beyond its text: the ChatMessage object, its strings' headers,
its slot in the lists that hold it."""
ENTRY_BYTES = 512
"""An entry's fixed cost: the objects around what it holds (encoder entry, token counts, dict
slots)."""
STATE_BYTES = 1700
"""A folded state's fixed cost: the SessionState and its containers, 1.56 kB for a session only
created (tracemalloc, Python 3.11). With these three the estimate is 1.1x what tracemalloc
measures a session's state holds when it was only created, and 1.2-1.35x what a worker's entries
of a session hold, from no turn to ten (bench/session_cache_memory.py): a bound a little above
the real use, never below it."""


class Kind(Generic[V]):
    """A kind of value kept per session (the folded state, the encoded snapshot...): typed, so
    ``get`` returns what ``put`` was given."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Kind({self.name!r})"


class _Session:
    __slots__ = ("values", "bytes")

    def __init__(self) -> None:
        self.values: dict[Kind[Any], tuple[Any, int]] = {}
        self.bytes = 0


class SessionCache:
    """Values per (session, kind), at most ``budget_bytes`` of them by estimate; least recently
    used sessions are evicted whole."""

    def __init__(self, budget_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if budget_bytes < 0:
            raise ValueError(f"a cache budget must be >= 0 bytes, not {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.bytes = 0
        """The estimated bytes held now."""
        self.evicted = 0
        """Sessions evicted so far (to size the budget: a busy worker evicting often reads more)."""
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str, kind: Kind[V]) -> V | None:
        """The session's value of ``kind`` (the session becomes the most recently used)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            return None
        self._sessions.move_to_end(session_id)
        found = entry.values.get(kind)
        return None if found is None else cast(V, found[0])

    def put(self, session_id: str, kind: Kind[V], value: V, nbytes: int) -> None:
        """Keep ``value`` (``nbytes`` by estimate), then evict other sessions while over budget."""
        entry = self._sessions.get(session_id)
        if entry is None:
            entry = self._sessions[session_id] = _Session()
        else:
            self._sessions.move_to_end(session_id)
        old = entry.values.get(kind)
        change = nbytes - (old[1] if old is not None else 0)
        entry.values[kind] = (value, nbytes)
        entry.bytes += change
        self.bytes += change
        while self.bytes > self.budget_bytes and len(self._sessions) > 1:
            oldest = next(iter(self._sessions))
            if oldest == session_id:
                break
            self.bytes -= self._sessions.pop(oldest).bytes
            self.evicted += 1

    def discard(self, session_id: str, kind: Kind[Any] | None = None) -> None:
        """Forget the session's value of ``kind`` (None: everything of the session)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            return
        if kind is None:
            self.bytes -= self._sessions.pop(session_id).bytes
            return
        old = entry.values.pop(kind, None)
        if old is not None:
            entry.bytes -= old[1]
            self.bytes -= old[1]


def history_bytes(messages: Sequence[ChatMessage], start: int = 0) -> int:
    """An estimate of the memory ``messages[start:]`` keep alive (text, tool calls, objects)."""
    total = 0
    for message in messages[start:]:
        total += MESSAGE_BYTES + len(message.content)
        for call in message.tool_calls:
            total += MESSAGE_BYTES // 2 + len(call.arguments_json) + len(call.name)
    return total
