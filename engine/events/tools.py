"""The events of tool calls: requested, started, finished, waiting for approval and decided,
stopped by a loop guard, superseded, or invoked directly; and ``ToolCallSpec``, a call as the
model asked for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .envelope import Event


@dataclass(frozen=True, slots=True)
class ToolCallSpec:
    """One tool call as the model asked for it."""

    call_id: str
    name: str
    arguments_json: str
    """The arguments exactly as the model produced them (may be invalid JSON)."""


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
