"""The events of a session's life: created, messages in and dropped, turns started and
finished, state changes, budget pauses, cancels, closes, erasures, snapshots and forks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .envelope import Event


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionCreated(Event):
    agent_id: str
    user_id: str
    role: str = "user"
    model: str = ""
    metadata_json: str = "{}"
    type: ClassVar[str] = "SessionCreated"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserMessageReceived(Event):
    message_id: str
    text: str
    user_id: str = ""
    type: ClassVar[str] = "UserMessageReceived"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserMessageDropped(Event):
    """An accepted user message that no turn will answer, and why: every accepted message ends
    answered (a turn took it) or with this event, which the sender's stream shows."""

    message_id: str
    """The waiting message (its UserMessageReceived is earlier on the log)."""
    reason: str
    """closed: the session was closed before a turn took the message (a force-finish, or the
    message arrived after the close) | fork_rest: a fork made to rest inherited it waiting |
    cancelled: a cancel came before a turn took it (in the cancel's commit; its causation_id is
    the CancelRequested's event id)."""
    detail: str = ""
    """What the sender is told."""
    type: ClassVar[str] = "UserMessageDropped"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStarted(Event):
    turn_id: str
    message_id: str
    """The user message this turn answers."""
    type: ClassVar[str] = "TurnStarted"


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChanged(Event):
    from_state: str
    to_state: str
    cause: str
    """One of ``turnlog.engine.states.Cause``: why the session moved."""
    detail: str = ""
    type: ClassVar[str] = "StateChanged"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFinished(Event):
    turn_id: str
    message_id: str
    reason: str
    """answered | iteration_cap | repeated_call | unchanged_result | model_error | forced |
    cancelled | budget | expired (a paused turn whose session expired), ..."""
    iterations: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    cost_micros: int = 0
    type: ClassVar[str] = "TurnFinished"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClosed(Event):
    """The session takes no more messages: force-finished, or expired (engine.expiry)."""

    reason: str
    """The admin's reason, or ``expired`` (no activity for the agent's ``Lifecycle.idle_expiry``)."""
    actor: str = "user"
    """Who closed it; ``lifecycle`` for an expiry."""
    type: ClassVar[str] = "SessionClosed"


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequested(Event):
    """A user or admin asks the running turn to stop at its next step boundary; the messages
    waiting for a turn are dropped in the same commit (engine.interrupts.add_cancel)."""

    reason: str
    actor: str = "user"
    type: ClassVar[str] = "CancelRequested"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionErased(Event):
    """The session's content was erased (engine.erasure): its data key is destroyed, so every
    content field of its events reads as erased from now on (engine.crypto.fields). Written on
    a closed session (the erasure force-finishes an open one in the same commit); metadata only."""

    erasure_id: str
    """The erasure request (one per user or session erased)."""
    scope: str
    """user | session."""
    reason: str
    """Why: ``retention``, or what the admin gave."""
    actor: str = "admin"
    user_id: str = ""
    """The session's user, so an erased fork (whose user was in its erased state) still names it."""
    type: ClassVar[str] = "SessionErased"


RESTORE_POINT = 0
"""SnapshotTaken.state_format of a restore point: no state, only what had happened by then."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotTaken(Event):
    """The folded session state as of the previous version (engine.snapshots); loading starts here.
    After a tool step it may be a restore point instead, holding only what had happened by then."""

    state_format: int
    """Serialisation format of ``state_json`` (engine.snapshot_format.FORMAT); unknown formats are refused."""
    status: str
    last_tool: str
    """Name of the last tool that returned in the current turn, "" if none."""
    turns: int
    input_tokens: int
    output_tokens: int
    message_count: int
    keyframe_version: int
    """0: ``state_json`` holds every message (a keyframe). Otherwise it holds the messages after
    the first ``k`` ones, which are those of the snapshot it builds on: the keyframe
    SnapshotTaken at this version (format 3), or the previous snapshot of this keyframe's chain
    (format 4, ``"p"`` in the JSON)."""
    state_json: str
    type: ClassVar[str] = "SnapshotTaken"

    @property
    def holds_state(self) -> bool:
        """False for a restore point (format 0: no ``state_json``; its state is the newest
        snapshot before it that holds one, with the events between folded on top)."""
        return self.state_format != RESTORE_POINT


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionForked(Event):
    """Version 1 of a session forked from another one's snapshot: it starts with that state."""

    origin_session_id: str
    origin_version: int
    """Version of the origin's SnapshotTaken this fork starts from."""
    agent_id: str
    model: str
    state_format: int
    state_json: str
    """The origin's state at the snapshot (engine.snapshot_format), re-keyed to this session on fold."""
    unfinished: str = ""
    """What the admin chose for the origin's unfinished work at the snapshot (a running turn,
    waiting messages): ``continue`` (a worker carries it on at once; a tool call that had
    started in the origin is never repeated) or ``rest`` (the turn is closed, the messages are
    dropped, the fork waits for a new message). "" when there was none (or before the choice)."""
    refs_renumbered: bool = False
    """The inherited messages and waiting messages take refs -n..-1 in the fork, in order, so
    they never collide with the refs of the fork's own events (their versions); false in forks
    written before, whose inherited messages keep the origin's refs."""
    origin_calls_json: str = "[]"
    """JSON list of {"message_id", "call_id", "tool_name", "arguments_json", "status",
    "content"}: the tool calls the origin had started after the snapshot while answering a
    message the fork carries on (``continue``). The fork never repeats one whose tool is not
    idempotent; it tells the model what the origin got instead (engine.tools.batch)."""
    type: ClassVar[str] = "SessionForked"


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetExceeded(Event):
    turn_id: str
    level: str
    """per-turn | per-session | per-user daily"""
    limit_micros: int
    spent_micros: int
    worst_case_micros: int
    """What the next call could cost; it was not made. The session waits in PAUSED_FOR_USER."""
    type: ClassVar[str] = "BudgetExceeded"


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetDecided(Event):
    turn_id: str
    decision: str
    """raise (the turn goes on with ``extra_micros`` more to spend) | stop (the turn ends)."""
    extra_micros: int = 0
    actor: str = "user"
    note: str = ""
    type: ClassVar[str] = "BudgetDecided"
