"""Session snapshots (seed §8): the folded state written to the log, so loading starts there.

After every tool step and at every turn end the turn loop adds a ``SnapshotTaken`` to the
step's commit; its ``state_json`` holds the session state as of the version before it, in the
snapshot format (engine.snapshot_format). Loading restores the newest snapshot and folds only
the events after it, so a load costs the same however long the session is.

Most snapshots are deltas: they hold the messages added since the previous snapshot of their
chain, which starts at a keyframe that holds every message, so a snapshot stays small on a long
session and a load reads one chain (``CHAIN_LIMIT`` links at most). A tool step's snapshot is
a restore point (format 0, no state) while a full one is near (``FULL_EVERY``, ``FULL_CHARS``):
an admin can still restore there (``state_before``), and a load skips it. A snapshot that cannot
be read is refused (``SnapshotFormatError``) and the loader folds from the start, which is
always correct. docs/architecture.md ("Snapshot formats") has the formats and the reasons.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Sequence

from . import events as ev
from .crypto.fields import ERASED_TEXT
from .errors import SnapshotFormatError
from .fold import SessionState, TurnProgress, fold, state_from
from .log.base import EventLog
from .messages import ChatMessage, grew_at_end
from .session_cache import ENTRY_BYTES, Kind, SessionCache
from .snapshot_format import (
    CALL_FIELDS,
    FORMAT,
    INBOX_FIELDS,
    READS,
    RECORD_FIELDS,
    SESSION_FIELDS,
    TURN_FIELDS,
    compact_json,
    decode,
    message_row,
)
from .tools.guards import CallRecord
from .writer import SessionWriter

RESTORE_POINT = ev.RESTORE_POINT
"""The ``state_format`` of a snapshot that holds no state (``state_json`` is empty)."""
FULL_EVERY = 64
"""A tool step's snapshot holds the state once the newest one that does is this many events back
(or is unknown to the encoder); before that it is a restore point. Bounds what a load folds."""
FULL_CHARS = 2048
"""Or once the messages added since hold this many characters (tool results, arguments, text)."""
DELTA_LIMIT = 128
"""Messages a chain may add beyond its keyframe before the next snapshot is a keyframe."""
CHAIN_LIMIT = 64
"""Deltas a chain may hold before the next snapshot is a keyframe (bounds a load's reads)."""
MESSAGE_TYPES = ("SessionForked", "UserMessageReceived", "AssistantMessage", "ToolCallFinished")
"""The events a format-1 snapshot's messages came from (their ref is its version), and a fork's
first event (whose messages came from none of this session's events)."""


@dataclass(slots=True)
class _Encoded:
    messages: list[ChatMessage]
    last: ChatMessage | None
    parts: list[str]
    keyframe_version: int = 0
    keyframe_count: int = 0
    previous_version: int = 0
    """The last snapshot encoded for this fold (the next delta's ``"p"``) and its message count."""
    previous_count: int = 0
    chain: int = 0
    """Deltas encoded on the current keyframe."""
    history: list[CallRecord] | None = None
    """The turn history the last snapshot encoded for this fold held, and how many records
    (the next delta in the same turn holds only the ones after them)."""
    history_count: int = 0
    nbytes: int = ENTRY_BYTES
    """An estimate of the memory ``parts`` take (engine.session_cache)."""


ENCODED: Kind[_Encoded] = Kind("snapshot")
"""A session's encoded messages, in the runner's ``SessionCache``."""
PART_BYTES = 80
"""An encoded message's fixed cost beyond its text (the str object, its list slot)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    state_json: str
    keyframe_version: int
    """0: ``state_json`` holds every message; else the first ``len(messages) - delta`` messages
    are those of the keyframe snapshot at this version."""


class SnapshotEncoder:
    """Serialises session states for snapshots, cheaply on a long session.

    History is append-only, so each message is encoded once per session (cached), and most
    snapshots are deltas: they carry the messages added since the previous snapshot of their
    chain and name it and the chain's keyframe (a snapshot holding every message). A keyframe
    is written when the chain would exceed ``delta_limit`` messages or ``chain_limit`` deltas,
    and whenever the encoder has no keyframe for the session's current fold (first snapshot,
    a reloaded state, a cache eviction), so a delta never points at a snapshot that was not
    appended with it or before.
    """

    def __init__(
        self,
        cache: SessionCache | None = None,
        *,
        delta_limit: int = DELTA_LIMIT,
        chain_limit: int = CHAIN_LIMIT,
    ) -> None:
        """``cache``: the runner's (None: one of its own, for an encoder used once)."""
        self._cache = cache if cache is not None else SessionCache()
        self._delta_limit = delta_limit
        self._chain_limit = chain_limit

    def encode(self, state: SessionState, version: int) -> Encoded:
        """The snapshot of ``state`` that will be written as event ``version``."""
        entry = self._entry(state)
        count = len(entry.parts)
        if (
            entry.keyframe_version
            and count - entry.keyframe_count <= self._delta_limit
            and entry.chain < self._chain_limit
        ):
            base, previous, skip = entry.keyframe_version, entry.previous_version, entry.previous_count
            kept = _kept_history(entry, state.turn)
            entry.chain += 1
        else:
            base, previous, skip, kept = 0, 0, 0, 0
            entry.keyframe_version, entry.keyframe_count, entry.chain = version, count, 0
        entry.previous_version, entry.previous_count = version, count
        entry.history = None if state.turn is None else state.turn.history
        entry.history_count = 0 if entry.history is None else len(entry.history)
        text = encode_state(state, entry.parts[skip:], base=base, skip=skip, previous=previous, kept=kept)
        return Encoded(text, base)

    def restore_point_ok(self, state: SessionState, version: int) -> bool:
        """Whether the snapshot of ``state`` at ``version`` may be a restore point: this encoder
        wrote one holding this fold fewer than ``FULL_EVERY`` versions before, and the messages
        added since hold fewer than ``FULL_CHARS`` characters. (A step that added more has its
        state written now, in the commit that carries the same text, where the log's compression
        folds the two; left to a later commit, the text would be stored twice.)"""
        cached = self._cache.get(state.session_id, ENCODED)
        if cached is None or not cached.previous_version or not _same_fold(cached, state.messages):
            return False
        if version - cached.previous_version >= FULL_EVERY:
            return False
        added = state.messages[cached.previous_count :]
        chars = sum(len(m.content) + sum(len(c.arguments_json) for c in m.tool_calls) for m in added)
        return chars < FULL_CHARS

    def _entry(self, state: SessionState) -> _Encoded:
        messages = state.messages
        cached = self._cache.get(state.session_id, ENCODED)
        if cached is None or not _same_fold(cached, messages):
            cached = _Encoded(messages, None, [])
        n = len(cached.parts)
        added = [message_row(m) for m in messages[n:]]
        cached.parts.extend(added)
        cached.nbytes += sum(PART_BYTES + len(part) for part in added)
        cached.last = messages[-1] if messages else None
        self._cache.put(state.session_id, ENCODED, cached, cached.nbytes)
        return cached


def _same_fold(cached: _Encoded, messages: list[ChatMessage]) -> bool:
    """Whether ``messages`` is the list the cache encoded, grown only at its end since."""
    return grew_at_end(messages, cached.messages, len(cached.parts), cached.last)


def _kept_history(entry: _Encoded, turn: TurnProgress | None) -> int:
    """How many of the turn's history records the previous snapshot encoded for this fold
    holds already: all it held if it was of this turn (history is append-only per turn), else
    none."""
    if turn is None or turn.history is not entry.history or len(turn.history) < entry.history_count:
        return 0
    return entry.history_count


def encode_state(
    state: SessionState,
    parts: list[str] | None = None,
    *,
    base: int = 0,
    skip: int = 0,
    previous: int = 0,
    kept: int = 0,
) -> str:
    """The ``FORMAT`` text of ``state``; ``parts`` are its encoded messages from index ``skip``
    (all of them, encoded here, when None). A delta names its keyframe (``base``) and the
    snapshot whose first ``skip`` messages and first ``kept`` turn history records it builds
    on (``previous``)."""
    if parts is None:
        parts = [message_row(m) for m in state.messages[skip:]]
    session = list(_SESSION_ROW(state))  # the status is a StrEnum: JSON writes its name
    if state.origin_calls:
        session[_ORIGIN_CALLS] = {
            mid: [_RECORD_ROW(r) for r in rows] for mid, rows in state.origin_calls.items()
        }
    turn = state.turn
    doc_turn: list[Any] | None = None
    if turn is not None:
        doc_turn = list(_TURN_ROW(turn))
        doc_turn[_HISTORY] = [_RECORD_ROW(r) for r in turn.history[kept:]]
        doc_turn.append([_CALL_ROW(c) for c in turn.tool_calls.values()])
    head = compact_json(
        {
            "s": session,
            "i": [_INBOX_ROW(m) for m in state.inbox],
            "t": doc_turn,
            "b": base,
            "k": skip,
            "p": previous,
            "h": kept,
        }
    )
    return head[:-1] + ',"m":[' + ",".join(parts) + "]}"


_SESSION_ROW = attrgetter(*SESSION_FIELDS)
_TURN_ROW = attrgetter(*TURN_FIELDS)
_CALL_ROW = attrgetter(*CALL_FIELDS)
_RECORD_ROW = attrgetter(*RECORD_FIELDS)
_INBOX_ROW = attrgetter(*INBOX_FIELDS)
"""Each gives a tuple of the fields in format order, which JSON writes as a list."""
_ORIGIN_CALLS = SESSION_FIELDS.index("origin_calls")
_HISTORY = TURN_FIELDS.index("history")


def decode_state(
    text: str,
    state_format: int,
    *,
    where: str,
    base: list[ChatMessage] | None = None,
    base_version: int | None = None,
    base_turn: TurnProgress | None = None,
) -> SessionState:
    """The state a snapshot holds (engine.snapshot_format.decode says what the rest needs)."""
    return state_from(
        decode(text, state_format, where=where, base=base, base_version=base_version, base_turn=base_turn)
    )


def forked_state(forked: ev.SessionForked) -> SessionState:
    """The origin's state a fork started from; an empty one once the fork is erased."""
    if forked.state_json == ERASED_TEXT:
        return SessionState(forked.session_id)
    where = f"session {forked.session_id} v{forked.version}"
    return decode_state(forked.state_json, forked.state_format, where=where)


def restore(snapshot: ev.SnapshotTaken, *chain: ev.SnapshotTaken | None) -> SessionState:
    """The session's state as of ``snapshot.version - 1``; fold the snapshot event and what
    follows it on top. A delta snapshot needs the snapshots it builds on, oldest first: its
    keyframe (``snapshot.keyframe_version``) and, from format 4, the deltas of its chain
    between them (``chain_of`` reads them)."""
    where = f"session {snapshot.session_id} v{snapshot.version}"
    base = base_version = base_turn = None
    if snapshot.keyframe_version:
        links = [link for link in chain if link is not None]
        keyframe = links[0] if links else None
        if (
            keyframe is None
            or keyframe.session_id != snapshot.session_id
            or keyframe.version != snapshot.keyframe_version
            or keyframe.keyframe_version
        ):
            raise SnapshotFormatError(f"{where}: its keyframe v{snapshot.keyframe_version} is missing")
        prior, base_version = restore(keyframe), keyframe.version
        for link in links[1:]:
            if link.session_id != snapshot.session_id or link.keyframe_version != keyframe.version:
                raise SnapshotFormatError(f"{where}: snapshot v{link.version} is not on its chain")
            prior = _decode_link(link, prior, base_version)
            base_version = link.version
        base, base_turn = prior.messages, prior.turn
    state = decode_state(
        snapshot.state_json,
        snapshot.state_format,
        where=where,
        base=base,
        base_version=base_version,
        base_turn=base_turn,
    )
    if state.session_id != snapshot.session_id or state.version != snapshot.version - 1:
        raise SnapshotFormatError(
            f"{where}: the snapshot holds session {state.session_id} v{state.version}, "
            f"not v{snapshot.version - 1} of this session"
        )
    return state


def _decode_link(link: ev.SnapshotTaken, prior: SessionState, prior_version: int) -> SessionState:
    """A delta of a chain, decoded on the state of the snapshot before it (at ``prior_version``)."""
    return decode_state(
        link.state_json,
        link.state_format,
        where=f"session {link.session_id} v{link.version}",
        base=prior.messages,
        base_version=prior_version,
        base_turn=prior.turn,
    )


async def chain_of(log: EventLog, snapshot: ev.SnapshotTaken) -> list[ev.SnapshotTaken]:
    """The snapshots a delta builds on, oldest first (``restore``'s ``chain``): its keyframe
    (one index lookup) and, from format 4, the snapshots after it (one range read)."""
    if not snapshot.keyframe_version:
        return []
    layout = READS.get(snapshot.state_format)
    if layout is not None and layout.chained:
        sid, first = snapshot.session_id, snapshot.keyframe_version
        found = await log.snapshots_between(sid, first, snapshot.version - 1)
    else:
        keyframe = await log.latest_snapshot(snapshot.session_id, at_or_before=snapshot.keyframe_version)
        found = [] if keyframe is None else [keyframe]
    return [s for s in found if isinstance(s, ev.SnapshotTaken)]


async def state_before(log: EventLog, snapshot: ev.SnapshotTaken) -> SessionState:
    """The session's state as of ``snapshot.version - 1`` (``restore``'s), for a restore point
    too: the newest snapshot before it that holds a state, with the events between folded on
    top (from the session's start when there is none or it cannot be read)."""
    if snapshot.holds_state:
        return restore(snapshot, *await chain_of(log, snapshot))
    session_id, state = snapshot.session_id, None
    base = await log.latest_snapshot(session_id, at_or_before=snapshot.version - 1)
    if isinstance(base, ev.SnapshotTaken):
        try:
            state = restore(base, *await chain_of(log, base))
        except SnapshotFormatError:
            state = None
    after = state.version if state is not None else 0
    events = await log.read_session(session_id, after)
    return fold(session_id, (e for e in events if e.version < snapshot.version), state)


async def load_latest(log: EventLog, session_id: str) -> SessionState | None:
    """The state of the session's newest snapshot (an index lookup and a range read), or None."""
    snapshot = await log.latest_snapshot(session_id)
    if not isinstance(snapshot, ev.SnapshotTaken) or snapshot.state_json == ERASED_TEXT:
        return None  # none, or erased (engine.crypto): fold the events
    chain = await chain_of(log, snapshot)
    state = restore(snapshot, *chain)
    formats = {snapshot.state_format, *(link.state_format for link in chain)}
    if all(READS[f].refs for f in formats):
        return state
    if len(formats) > 1:
        return None  # refs on some messages only: fold from the start
    return _with_refs(state, await log.versions_of(session_id, MESSAGE_TYPES, snapshot.version))


def _with_refs(state: SessionState, versions: Sequence[tuple[int, str]]) -> SessionState | None:
    """A format-1 state with every message's ref: the version of the event it came from,
    matched by role in log order (user messages skip the ones still waiting). None when the log
    does not match the history exactly (a fork: its inherited messages have no events here)."""
    waiting = {m.version for m in state.inbox}
    by_role: dict[str, list[int]] = {"user": [], "assistant": [], "tool": []}
    for version, kind in sorted(versions):
        role = _ROLE_OF.get(kind)
        if role is None:
            return None  # a SessionForked: messages that came from no event of this session
        if not (role == "user" and version in waiting):
            by_role[role].append(version)
    roles: list[str] = [m.role for m in state.messages]
    if sorted(roles) != sorted(role for role, found in by_role.items() for _ in found):
        return None  # not one event per message
    queues = {role: iter(found) for role, found in by_role.items()}
    state.messages = [dataclasses.replace(m, ref=next(queues[m.role])) for m in state.messages]
    return state


_ROLE_OF = {"UserMessageReceived": "user", "AssistantMessage": "assistant", "ToolCallFinished": "tool"}


def last_tool(state: SessionState) -> str:
    """Name of the last tool result of the current (or just finished) turn, "" if none."""
    for message in reversed(state.messages):
        if message.role == "user":
            return ""
        if message.role == "tool":
            return message.name or ""
    return ""


def take(
    w: SessionWriter, encoder: SnapshotEncoder, *, correlation_id: str | None = None, step: bool = False
) -> None:
    """Add a SnapshotTaken of the writer's state (as of its last event) to the pending batch.
    ``step``: taken after a tool step, so a restore point when a full snapshot of this fold is
    near (``SnapshotEncoder.restore_point_ok``)."""
    state = w.state
    version = state.version + 1
    if step and encoder.restore_point_ok(state, version):
        encoded, state_format = Encoded("", 0), RESTORE_POINT
    else:
        encoded, state_format = encoder.encode(state, version), FORMAT
    w.add(
        ev.SnapshotTaken,
        state_format=state_format,
        status=str(state.status),
        last_tool=last_tool(state),
        turns=state.turns_finished,
        input_tokens=state.input_tokens,
        output_tokens=state.output_tokens,
        message_count=len(state.messages),
        keyframe_version=encoded.keyframe_version,
        state_json=encoded.state_json,
        correlation_id=correlation_id,
    )


__all__ = [
    "FORMAT",
    "Encoded",
    "SnapshotEncoder",
    "chain_of",
    "decode_state",
    "encode_state",
    "last_tool",
    "load_latest",
    "restore",
    "state_before",
    "take",
]
