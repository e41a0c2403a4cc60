"""The events on the log: one frozen dataclass per event type.

Every event carries the envelope (session, per-session version, ids, time, producer) followed
by its payload. The Avro schemas in ``schemas/`` are the wire contract; ``tests/test_codec``
checks that every class here matches its schema field for field.

JSON-shaped values (tool arguments, tool output) travel as JSON text in ``*_json`` fields so the
schema stays stable however tools evolve.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

_IDS_PER_READ = 256
_ids: list[str] = []
"""Random ids read ahead: one ``os.urandom`` call serves 256 of them (each call is a system
call, 0.9 us on a quiet VM and more on a busy one, and a model step makes about ten ids; one id
now costs 0.4 us). ``list.pop`` and ``extend`` are atomic, so threads share it safely; a forked
child starts with none (it would repeat the parent's)."""
os.register_at_fork(after_in_child=_ids.clear)


def new_id() -> str:
    """A random 128-bit id as 32 hex characters (the shape of uuid4().hex, a tenth of its cost)."""
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
    message arrived after the close) | fork_rest: a fork made to rest inherited it waiting."""
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
class ModelCallStarted(Event):
    turn_id: str
    step: int
    """0-based index of the model call within its turn."""
    model: str
    message_count: int
    tools_offered: int
    estimated_input_tokens: int = 0
    """The request's size counted before sending it; 0 if the model gives no estimate."""
    section_tokens_json: str = "{}"
    """Tokens each context section used ({"system": .., "tools": .., "memory": .., "state": ..,
    "recall": .., "history": .., "input": ..}), counted with the model's tokenizer."""
    type: ClassVar[str] = "ModelCallStarted"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallFinished(Event):
    turn_id: str
    step: int
    model: str
    status: str
    """"ok" or "failed"."""
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0
    retries: int = 0
    finish_reason: str = ""
    error: str | None = None
    cached_input_tokens: int = 0
    """Input tokens served from the provider's prompt cache (included in input_tokens)."""
    cost_micros: int = 0
    """Cost in micro-dollars by the agent's price table; 0 if the model is unpriced."""
    estimated: bool = False
    """The token counts (and so the cost) are the engine's, not the provider's usage: a call
    that was cancelled, interrupted or failed gets the request's size counted before sending
    and the tokens of the text streamed before it stopped (``status`` says which)."""
    type: ClassVar[str] = "ModelCallFinished"


@dataclass(frozen=True, slots=True, kw_only=True)
class AuxiliaryModelCall(Event):
    """A model call the engine made for its own work, not a step of the conversation: a context
    summary (inside a turn) or a memory extraction (after one), with what it used and cost.
    It counts in the session's (and its turn's) tokens, cost and budgets like a turn's calls."""

    turn_id: str
    """The turn it was made in or for ("" if none)."""
    purpose: str
    """summary | memory_extraction."""
    model: str
    status: str
    """ok | failed."""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_micros: int = 0
    latency_ms: float = 0.0
    estimated: bool = False
    """The counts are the engine's (the request counted before sending, the text streamed back),
    not the provider's usage."""
    error: str = ""
    type: ClassVar[str] = "AuxiliaryModelCall"


@dataclass(frozen=True, slots=True)
class ToolCallSpec:
    """One tool call as the model asked for it."""

    call_id: str
    name: str
    arguments_json: str
    """The arguments exactly as the model produced them (may be invalid JSON)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AssistantMessage(Event):
    """A complete model message; never a half-streamed one."""

    turn_id: str
    message_id: str
    text: str
    tool_calls: tuple[ToolCallSpec, ...] = ()
    type: ClassVar[str] = "AssistantMessage"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRequested(Event):
    turn_id: str
    call_id: str
    tool_name: str
    arguments_json: str
    iteration: int
    """1-based tool iteration of the turn this call belongs to."""
    type: ClassVar[str] = "ToolCallRequested"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallStarted(Event):
    turn_id: str
    call_id: str
    tool_name: str
    attempt: int = 1
    idempotency_key: str = ""
    """The call's key for external systems, the same on every attempt and after a crash
    (``turnlog.engine.tools.ledger``); "" in logs written before it existed."""
    type: ClassVar[str] = "ToolCallStarted"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallFinished(Event):
    turn_id: str
    call_id: str
    tool_name: str
    status: str
    """One of ``turnlog.engine.tools.ToolStatus``: success, failed, timeout, rejected, interrupted."""
    content: str
    """The text the model is given (failures start with a marker)."""
    output_json: str | None = None
    """The full structured result, when the tool returned one."""
    elapsed_ms: float = 0.0
    attempts: int = 1
    error: str | None = None
    type: ClassVar[str] = "ToolCallFinished"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnFinished(Event):
    turn_id: str
    message_id: str
    reason: str
    """answered | iteration_cap | repeated_call | unchanged_result | model_error | forced."""
    iterations: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    cost_micros: int = 0
    type: ClassVar[str] = "TurnFinished"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClosed(Event):
    reason: str
    actor: str = "user"
    type: ClassVar[str] = "SessionClosed"


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequested(Event):
    """A call of a tool marked ``requires_approval`` waits for the user (the session pauses)."""

    turn_id: str
    call_id: str
    tool_name: str
    arguments_json: str
    """The validated arguments the user is asked to approve."""
    sensitivity: str
    reason: str = ""
    type: ClassVar[str] = "ApprovalRequested"


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecided(Event):
    turn_id: str
    call_id: str
    decision: str
    """approved | edited | rejected."""
    arguments_json: str
    """The arguments the call runs with (the user's edit, validated again, or the original)."""
    actor: str = "user"
    note: str = ""
    """The user's reason; a rejection's note reaches the model."""
    type: ClassVar[str] = "ApprovalDecided"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopGuardTriggered(Event):
    turn_id: str
    guard: str
    """iteration_cap | repeated_call | unchanged_result (engine.tools.guards.Guard)."""
    reason: str
    tool_name: str = ""
    type: ClassVar[str] = "LoopGuardTriggered"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultSuperseded(Event):
    """A later call of the same turn (same tool, near-equal arguments) has a fresher result;
    context management may shorten this one."""

    turn_id: str
    call_id: str
    superseded_by: str
    type: ClassVar[str] = "ToolResultSuperseded"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolInvoked(Event):
    """A tool run directly through ``AgentSessions.invoke_tool``; not part of the conversation."""

    call_id: str
    tool_name: str
    arguments_json: str
    actor: str
    status: str
    content: str
    output_json: str | None = None
    elapsed_ms: float = 0.0
    attempts: int = 1
    error: str | None = None
    type: ClassVar[str] = "ToolInvoked"


RESTORE_POINT = 0
"""SnapshotTaken.state_format of a restore point: no state, only what had happened by then."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotTaken(Event):
    """The folded session state as of the previous version (engine.snapshots); loading starts here.
    After a tool step it may be a restore point instead, holding only what had happened by then."""

    state_format: int
    """Serialisation format of ``state_json`` (engine.snapshots.FORMAT); unknown formats are refused."""
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
class CancelRequested(Event):
    """A user or admin asks the running turn to stop at its next step boundary (engine.interrupts)."""

    reason: str
    actor: str = "user"
    type: ClassVar[str] = "CancelRequested"


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
    """The origin's state at the snapshot (engine.snapshots), re-keyed to this session on fold."""
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
class ModelFallback(Event):
    turn_id: str
    step: int
    from_model: str
    to_model: str
    reason: str
    """Why the previous model was left: its error, or which time limit it hit."""
    degraded: bool = False
    """The next model is the rule-based responder: the user is told the service is degraded."""
    type: ClassVar[str] = "ModelFallback"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCorrected(Event):
    """The engine corrected what a model wrote within one model step (engine.models.prompt_tools):
    the model was asked again with ``correction``, or, when that is empty, calls it repeated were
    only dropped. A dropped call is never run, whatever the model writes after."""

    turn_id: str
    step: int
    attempt: int
    """1-based: which of the step's answers this corrects."""
    kind: str
    """unreadable_call, repeated_call, other_tools, call_without_tools, no_answer (CorrectionKind)."""
    correction: str
    """The text the model was sent next; "" when nothing was sent."""
    model_text: str
    """What the model wrote (cut to 2,000 characters)."""
    dropped_calls_json: str = "[]"
    """JSON list of {"name", "arguments"}: calls that were not run and will not be."""
    type: ClassVar[str] = "ModelCorrected"


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextTrimmed(Event):
    turn_id: str
    step: int
    """The model step the trim was made for."""
    items_json: str
    """JSON list of what was cut: {"ref", "action": "removed"|"shortened", "reason", "tokens",
    "text"}; ``ref`` is the version of the event the message came from (its original stays on
    the log), ``text`` the shortened content (empty when removed)."""
    history_tokens_before: int
    history_tokens_after: int
    history_budget: int
    type: ClassVar[str] = "ContextTrimmed"


@dataclass(frozen=True, slots=True, kw_only=True)
class HistorySummarized(Event):
    turn_id: str
    step: int
    removed_refs_json: str
    """JSON list of the refs (source event versions) the summary replaces."""
    summary: str
    """The text that now stands in front of the history as one message."""
    summarizer: str
    """The model that wrote it, or ``extractive`` for the deterministic fallback."""
    reason: str
    """tokens (90 % of the history budget), turns (the agent's verbatim-turn limit),
    context_length (the provider refused the request) or budget (a cost budget)."""
    fallback: bool = False
    """The summariser failed and the deterministic extractive summary stands in."""
    error: str = ""
    """Why the summariser failed, when ``fallback``."""
    tokens_before: int = 0
    tokens_after: int = 0
    type: ClassVar[str] = "HistorySummarized"


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryRecalled(Event):
    turn_id: str
    query: str
    refs_json: str
    """JSON list of the archived refs brought back for this turn."""
    text: str
    """What the model is shown, quoting the archived messages."""
    type: ClassVar[str] = "HistoryRecalled"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoriesRetrieved(Event):
    turn_id: str
    query: str
    memories_json: str
    """JSON list of {"memory_id", "text", "tag", "score"} shown to the model this turn."""
    tokens: int = 0
    type: ClassVar[str] = "MemoriesRetrieved"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryNoted(Event):
    turn_id: str
    call_id: str
    """The ``remember`` tool call that asked for it; empty when noted another way."""
    user_id: str
    text: str
    tag: str
    """preference | conclusion | agreement (engine.memory.MemoryTag)."""
    type: ClassVar[str] = "MemoryNoted"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStateChanged(Event):
    turn_id: str
    call_id: str
    op: str
    """set (replace the named fields) | overwrite (replace the whole state) | reset (defaults)."""
    patch_json: str
    """The change as a JSON Patch (RFC 6902) list, the shape of AG-UI's STATE_DELTA."""
    state_json: str
    """The whole task state after the change."""
    type: ClassVar[str] = "TaskStateChanged"


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


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        SessionCreated,
        UserMessageReceived,
        UserMessageDropped,
        TurnStarted,
        StateChanged,
        ModelCallStarted,
        ModelCallFinished,
        AuxiliaryModelCall,
        ModelFallback,
        ModelCorrected,
        AssistantMessage,
        ToolCallRequested,
        ToolCallStarted,
        ToolCallFinished,
        TurnFinished,
        SessionClosed,
        ApprovalRequested,
        ApprovalDecided,
        LoopGuardTriggered,
        ToolResultSuperseded,
        ToolInvoked,
        SnapshotTaken,
        CancelRequested,
        SessionForked,
        ContextTrimmed,
        HistorySummarized,
        HistoryRecalled,
        MemoriesRetrieved,
        MemoryNoted,
        TaskStateChanged,
        BudgetExceeded,
        BudgetDecided,
    )
}

E = TypeVar("E", bound=Event)


def _quick_init(cls: type[Event]) -> None:
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


for _cls in EVENT_TYPES.values():
    _quick_init(_cls)
