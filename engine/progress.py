"""The parts of a session's folded state that a run moves along: the turn in progress, its
tool calls, and the user messages waiting for a turn.

They sit below the fold (engine.fold, whose ``SessionState`` holds them) so that the snapshot
format (engine.snapshot_format), which the fold reads a fork's state with, can build them
without importing the fold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .tools.execute import ToolStatus
from .tools.guards import CallRecord

FINAL_TOOL_STATUSES = frozenset(str(status) for status in ToolStatus)


@dataclass(slots=True)
class ToolCallProgress:
    call_id: str
    tool_name: str
    arguments_json: str
    status: str = "requested"
    """requested | started | one of FINAL_TOOL_STATUSES."""
    attempts: int = 0
    iteration: int = 0
    approval: str = ""
    """"" (none needed) | pending | approved | edited | rejected."""
    approval_note: str = ""
    first_started_ms: int = 0
    """``time_ms`` of its first ``ToolCallStarted`` (0: never started): with ``last_started_ms``
    what the crash-recovery rule reads (engine.tools.recovery)."""
    last_started_ms: int = 0


@dataclass(slots=True)
class TurnProgress:
    turn_id: str
    message_id: str
    started_version: int
    iterations: int = 0
    """Tool batches requested so far in this turn."""
    model_calls: int = 0
    """Model calls finished so far (ok or failed)."""
    model_calls_started: int = 0
    """Model calls begun, including one a crashed worker never finished; numbers the next step."""
    model_call_open: bool = False
    tool_calls: dict[str, ToolCallProgress] = field(default_factory=dict)
    """The current tool batch, in the order the model asked."""
    last_answer: str | None = None
    """Text of the last assistant message without tool calls."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0
    history: list[CallRecord] = field(default_factory=list)
    """Every finished call of the turn, in the order asked: what the loop guards look at."""
    guard: str = ""
    """The loop guard that stopped this turn's tool loop, if one did."""
    guard_reason: str = ""
    stop_reason: str | None = None
    """Set by CancelRequested: the turn stops at its next step boundary (engine.interrupts)."""
    stop_actor: str = ""
    memories: str = ""
    """The user's long-term memories shown to the model this turn (MemoriesRetrieved)."""
    recalled: str = ""
    """Archived messages brought back for this turn because the user referred to them."""
    context_retries: int = 0
    """Model calls redone after the provider refused the context as too long (at most one)."""
    budget_pause: str = ""
    """The budget level the turn waits on in PAUSED_FOR_USER ("" when not paused for one)."""
    budget_allowance_micros: int = 0
    """Extra spend the user allowed this turn after budget pauses."""

    def unfinished_calls(self) -> list[ToolCallProgress]:
        return [c for c in self.tool_calls.values() if c.status not in FINAL_TOOL_STATUSES]


@dataclass(slots=True)
class InboundMessage:
    message_id: str
    text: str
    event_id: str
    version: int = 0
    """Where it arrived; later than the running turn's start means it arrived mid-turn."""
