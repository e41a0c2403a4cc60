"""The session state machine (seed §2): states, causes, and the one transition table.

A transition is legal only if ``(from, to)`` is an edge below *and* the cause is one the edge
allows. Anything else raises IllegalTransitionError: a bug to fix, never a silent overwrite.
"""

from __future__ import annotations

from enum import StrEnum

from .errors import IllegalTransitionError


class SessionStatus(StrEnum):
    """The states of a session (seed §2); ``TRANSITIONS`` lists the moves between them."""

    IDLE = "IDLE"
    """Created, waiting for the first user message."""
    PROCESSING = "PROCESSING"
    """A model call is being built, made, or its answer handled."""
    TOOL_WAIT = "TOOL_WAIT"
    """The first tool batch of a turn is running."""
    TOOL_LOOP = "TOOL_LOOP"
    """A later tool batch of the same turn is running (the model chains tools)."""
    PAUSED_FOR_USER = "PAUSED_FOR_USER"
    """A tool call waits for the user's approval, or the turn for a decision on its budget."""
    ERROR = "ERROR"
    """The last turn failed; the next user message starts a new one."""
    FINISHED = "FINISHED"
    """The last turn ended with an answer; the next user message starts a new one."""
    CANCELLED = "CANCELLED"
    """The last turn was stopped by the user or an admin."""


class Cause(StrEnum):
    """Why a session changed state: every ``StateChanged`` names one, so a session reads back as
    the path it walked and why."""

    USER_MESSAGE = "user_message"
    MODEL_TOOL_CALL = "model_tool_call"
    MODEL_ANSWER = "model_answer"
    TOOL_RESULT = "tool_result"
    ITERATION_CAP = "iteration_cap"
    BUDGET = "budget"
    GUARD = "guard"
    MODEL_ERROR = "model_error"
    APPROVAL_REQUIRED = "approval_required"
    USER_APPROVAL = "user_approval"
    INTERRUPT = "interrupt"
    ADMIN = "admin"
    POISON_RECORD = "poison_record"
    """A record for the session could not be read or sequenced (Kafka inbox dead letter)."""
    EXPIRED = "expired"
    """The session had no activity for its agent's ``Lifecycle.idle_expiry`` and was closed
    (engine.expiry)."""


S, C = SessionStatus, Cause
_STOP = frozenset({C.INTERRUPT, C.ADMIN})
_CLOSE = frozenset({C.ADMIN, C.EXPIRED})

TRANSITIONS: dict[tuple[SessionStatus, SessionStatus], frozenset[Cause]] = {
    # a user message starts a turn from any resting state
    (S.IDLE, S.PROCESSING): frozenset({C.USER_MESSAGE}),
    (S.FINISHED, S.PROCESSING): frozenset({C.USER_MESSAGE}),
    (S.ERROR, S.PROCESSING): frozenset({C.USER_MESSAGE}),
    (S.CANCELLED, S.PROCESSING): frozenset({C.USER_MESSAGE}),
    # the model answers or asks for tools
    (S.PROCESSING, S.FINISHED): frozenset({C.MODEL_ANSWER, C.ITERATION_CAP, C.GUARD, C.BUDGET, C.ADMIN}),
    (S.PROCESSING, S.TOOL_WAIT): frozenset({C.MODEL_TOOL_CALL}),
    (S.PROCESSING, S.TOOL_LOOP): frozenset({C.MODEL_TOOL_CALL}),
    (S.PROCESSING, S.ERROR): frozenset({C.MODEL_ERROR}),
    # tool results go back to the model
    (S.TOOL_WAIT, S.PROCESSING): frozenset({C.TOOL_RESULT}),
    (S.TOOL_LOOP, S.PROCESSING): frozenset({C.TOOL_RESULT}),
    # approvals
    (S.TOOL_WAIT, S.PAUSED_FOR_USER): frozenset({C.APPROVAL_REQUIRED}),
    (S.TOOL_LOOP, S.PAUSED_FOR_USER): frozenset({C.APPROVAL_REQUIRED}),
    (S.PAUSED_FOR_USER, S.TOOL_WAIT): frozenset({C.USER_APPROVAL}),
    (S.PAUSED_FOR_USER, S.TOOL_LOOP): frozenset({C.USER_APPROVAL}),
    # a budget that pauses instead of stopping (Budget.on_exceed="pause")
    (S.PROCESSING, S.PAUSED_FOR_USER): frozenset({C.BUDGET}),
    (S.PAUSED_FOR_USER, S.PROCESSING): frozenset({C.USER_APPROVAL}),
    (S.PAUSED_FOR_USER, S.FINISHED): frozenset({C.ADMIN, C.BUDGET, C.EXPIRED}),
    # stopping a running turn
    (S.PROCESSING, S.CANCELLED): _STOP,
    (S.TOOL_WAIT, S.CANCELLED): _STOP,
    (S.TOOL_LOOP, S.CANCELLED): _STOP,
    (S.PAUSED_FOR_USER, S.CANCELLED): _STOP,
    # an admin may force-finish from anywhere that is not already finished; an idle session
    # (resting, or paused for the user) expires (engine.expiry)
    (S.IDLE, S.FINISHED): _CLOSE,
    (S.TOOL_WAIT, S.FINISHED): frozenset({C.ADMIN}),
    (S.TOOL_LOOP, S.FINISHED): frozenset({C.ADMIN}),
    (S.ERROR, S.FINISHED): _CLOSE,
    (S.CANCELLED, S.FINISHED): _CLOSE,
    # a resting session whose inbox record was dead-lettered (docs/architecture.md, Kafka)
    (S.IDLE, S.ERROR): frozenset({C.POISON_RECORD}),
    (S.FINISHED, S.ERROR): frozenset({C.POISON_RECORD}),
    (S.CANCELLED, S.ERROR): frozenset({C.POISON_RECORD}),
}
"""Every legal edge with the causes allowed on it. docs/architecture.md renders this table."""

RESTING = frozenset({S.IDLE, S.FINISHED, S.ERROR, S.CANCELLED})
"""States in which no turn is running; a new user message may start one."""


_LEGAL = frozenset((str(a), str(b), str(c)) for (a, b), causes in TRANSITIONS.items() for c in causes)
"""Every legal (from, to, cause) as plain strings: the check on every event, one set lookup."""


def check_transition(from_state: str, to_state: str, cause: str) -> None:
    """Raise IllegalTransitionError unless ``from -> to`` because of ``cause`` is in the table."""
    if (from_state, to_state, cause) in _LEGAL:
        return
    try:
        edge = (SessionStatus(from_state), SessionStatus(to_state))
        why = Cause(cause)
    except ValueError as exc:
        raise IllegalTransitionError(f"unknown state or cause: {exc}") from None
    allowed = TRANSITIONS.get(edge)
    if allowed is None:
        raise IllegalTransitionError(f"no transition {from_state} -> {to_state} in the table")
    if why not in allowed:
        names = ", ".join(sorted(allowed))
        raise IllegalTransitionError(
            f"{from_state} -> {to_state} cannot be caused by {cause}; allowed: {names}"
        )
