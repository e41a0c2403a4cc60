"""Session snapshots (seed §8): the folded state written to the log, so loading starts there.

After every tool step and at every turn end the turn loop adds a ``SnapshotTaken`` event to the
step's commit; its ``state_json`` is the session state as of the version before it. Loading a
session restores the latest snapshot (``EventLog.latest_snapshot``) and folds only the events
after it, so the cost of loading does not grow with the session's length.

The serialisation is positional JSON (short, fast to parse) and carries a format number.
A keyframe snapshot holds every message; most snapshots are deltas that hold the messages
added since the session's last keyframe and name it (``keyframe_version``), so a snapshot's
size stays bounded on a long session and loading reads at most two snapshots. Format history:

* 1: ``{"s": session fields, "i": inbox, "t": turn with its tool calls, "b": keyframe
  version or 0, "k": messages taken from the keyframe, "m": the other messages}``; field
  order as in the ``*_FIELDS`` tuples below.
* 2: as 1, plus the session's task state and archived count, the turn's memories, recalled
  text, context retries and budget pause, and each message's ``ref`` (context management).
* 3: as 2, plus the session's ``origin_calls`` (a fork's calls its origin had started), each
  message id's list of rows in RECORD_FIELDS order.
* 4: as 3, but a delta holds only the messages added since the previous snapshot of its chain
  (keyframe, delta, delta, ...), named by ``"p"`` (its version; ``"k"`` is the number of
  messages before this delta's own), so a snapshot costs what changed since the last one
  instead of everything since the keyframe. Loading reads the chain: the keyframe and the
  deltas after it (one range read, ``EventLog.snapshots_between``), at most ``CHAIN_LIMIT``
  of them, so it stays flat in session length. A link that is not where the delta says
  (``"p"``, ``"k"``) is refused and the loader folds from the start.
* 5: as 4, but a delta's turn also holds only the loop guards' records (``history``) added
  since the previous snapshot of its chain, when that snapshot was of the same turn (``"h"``:
  how many it takes from there; 0 in a keyframe). Before, every snapshot of a turn repeated the
  turn's whole history with every tool result in full, so a turn of K tool steps wrote K²/2
  results into its snapshots.
* 6: as 5, plus each tool call's ``first_started_ms`` and ``last_started_ms`` (the times the
  crash-recovery rule reads, engine.tools.recovery).

Restore points (format 0, ``RESTORE_POINT``): a snapshot after a tool step holds no state
when the session's newest snapshot that does is fewer than ``FULL_EVERY`` events back and the
messages added since are small (under ``FULL_CHARS`` characters: a large tool result is written
in the commit that carries its event, where the log's compression folds the two). It is
what seed §8 asks for (a point an admin can restore from, with what had happened by then) at the
cost of one small event: its ``state_json`` is empty, and its state is the newest full snapshot
before it with the events between folded on top (``state_before``). Loading skips them
(``EventLog.latest_snapshot`` returns only snapshots that hold a state), so a load still folds at
most about ``FULL_EVERY`` events plus one step's. Every turn end, and every snapshot whose fold
the encoder has not written a full one for (a reloaded state), holds the state.

Every format is read (``READS``): fields a format lacks take their defaults. Format 1 messages
carry no ``ref``; ``load_latest`` gives them the versions of the events they came from (one
index read of the session's message events, ``EventLog.versions_of``), or folds from the
start when that cannot be done exactly. A reader refuses formats it does not know
(``SnapshotFormatError``); the loader then folds from the start, which is always correct.
Changing a field of ``SessionState``, ``TurnProgress``,
``ToolCallProgress`` or ``InboundMessage`` means a new format number (tests/test_snapshots.py
holds the current layout and fails when a dataclass drifts from it).
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict, deque
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Sequence

from . import events as ev
from .errors import SnapshotFormatError
from .events import ToolCallSpec
from .fold import InboundMessage, SessionState, ToolCallProgress, TurnProgress, fold
from .log.base import EventLog
from .messages import ChatMessage, grew_at_end
from .states import SessionStatus
from .tools.guards import CallRecord
from .writer import SessionWriter

FORMAT = 6
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
SESSION_FIELDS = (
    "session_id",
    "version",
    "agent_id",
    "user_id",
    "role",
    "model",
    "status",
    "turns_finished",
    "closed",
    "close_reason",
    "input_tokens",
    "output_tokens",
    "cost_micros",
    "superseded",
    "created_ms",
    "updated_ms",
    "task_state",
    "archived",
    "origin_calls",
)
"""SessionState's plain fields; ``messages``, ``inbox`` and ``turn`` are written separately."""
INBOX_FIELDS = ("message_id", "text", "event_id", "version")
TURN_FIELDS = (
    "turn_id",
    "message_id",
    "started_version",
    "iterations",
    "model_calls",
    "model_calls_started",
    "model_call_open",
    "last_answer",
    "input_tokens",
    "output_tokens",
    "cost_micros",
    "history",
    "guard",
    "guard_reason",
    "stop_reason",
    "stop_actor",
    "memories",
    "recalled",
    "context_retries",
    "budget_pause",
    "budget_allowance_micros",
)
"""TurnProgress's fields but ``tool_calls``, which follows them as a list in request order;
``history`` (the loop guards' CallRecords) is a list of rows in RECORD_FIELDS order."""
CALL_FIELDS = (
    "call_id",
    "tool_name",
    "arguments_json",
    "status",
    "attempts",
    "iteration",
    "approval",
    "approval_note",
    "first_started_ms",
    "last_started_ms",
)
RECORD_FIELDS = ("call_id", "tool_name", "arguments_json", "iteration", "status", "result")


@dataclass(frozen=True, slots=True)
class Layout:
    """What one snapshot format holds: its session and turn fields, in order, and whether each
    message row ends with its ref."""

    session: tuple[str, ...]
    turn: tuple[str, ...]
    refs: bool
    chained: bool = False
    """A delta builds on the previous snapshot of its chain (``"p"``), not on its keyframe."""
    history_chained: bool = False
    """A delta's turn history starts with the first ``"h"`` records of the previous snapshot's."""
    call: tuple[str, ...] = CALL_FIELDS
    """A tool call's fields, in order."""


_CALLS_5 = CALL_FIELDS[:8]
"""A tool call's fields up to format 5 (no start times)."""
READS = {
    1: Layout(SESSION_FIELDS[:16], TURN_FIELDS[:16], refs=False, call=_CALLS_5),
    2: Layout(SESSION_FIELDS[:18], TURN_FIELDS, refs=True, call=_CALLS_5),
    3: Layout(SESSION_FIELDS, TURN_FIELDS, refs=True, call=_CALLS_5),
    4: Layout(SESSION_FIELDS, TURN_FIELDS, refs=True, chained=True, call=_CALLS_5),
    5: Layout(SESSION_FIELDS, TURN_FIELDS, refs=True, chained=True, history_chained=True, call=_CALLS_5),
    FORMAT: Layout(SESSION_FIELDS, TURN_FIELDS, refs=True, chained=True, history_chained=True),
}
"""Every format this turnlog reads."""
MESSAGE_TYPES = ("SessionForked", "UserMessageReceived", "AssistantMessage", "ToolCallFinished")
"""The events a format-1 snapshot's messages came from (their ref is its version), and a fork's
first event (whose messages came from none of this session's events)."""
_DUMP = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def _message(m: ChatMessage) -> str:
    calls = [[c.call_id, c.name, c.arguments_json] for c in m.tool_calls]
    return _DUMP([m.role, m.content, calls, m.tool_call_id, m.name, m.ref])


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
        self, cache_size: int = 1024, *, delta_limit: int = DELTA_LIMIT, chain_limit: int = CHAIN_LIMIT
    ) -> None:
        self._cache: OrderedDict[str, _Encoded] = OrderedDict()
        self._cache_size = cache_size
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
        cached = self._cache.get(state.session_id)
        if cached is None or not cached.previous_version or not _same_fold(cached, state.messages):
            return False
        if version - cached.previous_version >= FULL_EVERY:
            return False
        added = state.messages[cached.previous_count :]
        chars = sum(len(m.content) + sum(len(c.arguments_json) for c in m.tool_calls) for m in added)
        return chars < FULL_CHARS

    def _entry(self, state: SessionState) -> _Encoded:
        messages = state.messages
        cached = self._cache.pop(state.session_id, None)
        if cached is None or not _same_fold(cached, messages):
            cached = _Encoded(messages, None, [])
        n = len(cached.parts)
        cached.parts.extend(_message(m) for m in messages[n:])
        cached.last = messages[-1] if messages else None
        self._cache[state.session_id] = cached
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
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
        parts = [_message(m) for m in state.messages[skip:]]
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
    head = _DUMP(
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
    """The state a snapshot holds; a delta needs ``base``, the messages of the snapshot it
    builds on (its keyframe; from format 4 the previous snapshot of its chain), which is at
    ``base_version`` when given (checked), and from format 5 that snapshot's turn
    (``base_turn``) when it keeps some of its history. ``where`` names the record in errors.
    Format 1 messages get ref 0 (see ``load_latest``)."""
    layout = READS.get(state_format)
    if layout is None:
        raise SnapshotFormatError(
            f"{where}: snapshot format {state_format} is not one this turnlog reads (it reads "
            f"{', '.join(map(str, READS))}); upgrade turnlog. Loading folds the session from its first "
            "event instead."
        )
    try:
        doc = json.loads(text)
        scalars = dict(zip(layout.session, doc["s"], strict=True))
        scalars["status"] = SessionStatus(scalars["status"])
        if "origin_calls" in scalars:
            scalars["origin_calls"] = {
                mid: [CallRecord(*r) for r in rows] for mid, rows in scalars["origin_calls"].items()
            }
        state = SessionState(**scalars)
        state.inbox = deque(InboundMessage(*row) for row in doc["i"])
        own = [_decode_message(row, layout.refs) for row in doc["m"]]
        state.messages = _inherited(doc, base, base_version, layout, where) + own
        state.turn = None if doc["t"] is None else _turn(doc["t"], layout)
        if layout.history_chained and doc["h"]:
            _inherit_history(state.turn, doc["h"], base_turn, where)
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotFormatError(f"{where}: corrupt snapshot: {type(exc).__name__}: {exc}") from exc
    return state


def _inherited(
    doc: dict[str, Any], base: list[ChatMessage] | None, base_version: int | None, layout: Layout, where: str
) -> list[ChatMessage]:
    if not doc["b"]:
        return []
    on = doc["p"] if layout.chained else doc["b"]
    what = "the previous snapshot of its chain" if layout.chained else "its keyframe"
    if base is None or len(base) < doc["k"] or (base_version is not None and base_version != on):
        raise SnapshotFormatError(f"{where}: a delta snapshot needs the {doc['k']} messages of {what} v{on}")
    return base[: doc["k"]]


def _inherit_history(turn: TurnProgress | None, kept: int, base: TurnProgress | None, where: str) -> None:
    """Put the first ``kept`` history records of the previous snapshot's turn (``base``) before
    the ones this delta holds; refused unless that snapshot was of the same turn and had them."""
    if turn is None or base is None or base.turn_id != turn.turn_id or len(base.history) < kept:
        raise SnapshotFormatError(
            f"{where}: a delta snapshot needs the {kept} tool calls of its turn in the previous "
            "snapshot of its chain"
        )
    turn.history = base.history[:kept] + turn.history


def _decode_message(row: list[Any], with_ref: bool) -> ChatMessage:
    role, content, calls, call_id, name, *ref = row
    if len(ref) != int(with_ref):
        raise ValueError(f"a message row of {len(row)} fields")
    return ChatMessage(role, content, tuple(ToolCallSpec(*c) for c in calls), call_id, name, *ref)


def _turn(row: list[Any], layout: Layout) -> TurnProgress:
    *scalars, calls = row
    fields = dict(zip(layout.turn, scalars, strict=True))
    fields["history"] = [CallRecord(*r) for r in fields["history"]]
    turn = TurnProgress(**fields)
    for call in calls:
        progress = ToolCallProgress(**dict(zip(layout.call, call, strict=True)))
        turn.tool_calls[progress.call_id] = progress
    return turn


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
    if not isinstance(snapshot, ev.SnapshotTaken):
        return None
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


def restore_fork(state: SessionState, forked: ev.SessionForked) -> None:
    """Fold a SessionForked into an empty state: the origin's state, re-keyed to this session.

    Versions inside it (turn start, inbox arrivals) belong to the origin's numbering, so they
    are reset: everything inherited happened before the fork's first event. With
    ``refs_renumbered`` (every fork written now) the inherited messages, then the waiting ones,
    take the refs -n..-1 in order (``inherited_refs``), so the fork's context events never name
    an inherited message and one of its own alike; older forks keep the origin's refs and their
    waiting messages version 0. A fork is open even if its origin was closed.
    """
    where = f"session {forked.session_id} v{forked.version} (fork of {forked.origin_session_id})"
    origin = decode_state(forked.state_json, forked.state_format, where=where)
    for f in dataclasses.fields(SessionState):
        if f.name not in ("session_id", "version"):
            setattr(state, f.name, getattr(origin, f.name))
    state.agent_id, state.model, state.created_ms = forked.agent_id, forked.model, forked.time_ms
    state.closed, state.close_reason = False, ""  # a fork is a new, open session
    renumbered = renumbers(forked)
    refs = inherited_refs(len(state.messages), len(state.inbox)) if renumbered else None
    if refs is not None:
        state.messages = [dataclasses.replace(m, ref=r) for m, r in zip(state.messages, refs, strict=False)]
    for i, message in enumerate(state.inbox):
        message.version = refs[len(state.messages) + i] if refs is not None else 0
    if state.turn is not None:
        state.turn.started_version = 0
    for row in json.loads(forked.origin_calls_json):
        fields = (row["call_id"], row["tool_name"], row["arguments_json"], 0, row["status"], row["content"])
        state.origin_calls.setdefault(row["message_id"], []).append(CallRecord(*fields))


def renumbers(forked: ev.SessionForked) -> bool:
    """Whether the fork's inherited messages take refs below 0 (every fork written now; a fork
    of format 1 too: its messages had no refs, and nothing in it could have named one)."""
    return forked.refs_renumbered or forked.state_format == 1


def inherited_refs(messages: int, waiting: int) -> list[int]:
    """The refs a renumbering fork gives its inherited messages, then its waiting messages."""
    total = messages + waiting
    return list(range(-total, 0))


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
    "inherited_refs",
    "renumbers",
    "restore_fork",
    "state_before",
    "take",
]
