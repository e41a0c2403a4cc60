"""Cost budgets (seed §5.3): per turn, per session, per user per day.

Before each model call the engine prices the worst case (the request as estimated, plus the
model's whole output allowance) and compares it with what is left of every budget that applies.
A call that could overrun is not made (once compacting the context could not make it fit): the
turn stops with a message that names the budget, so spending never silently runs past a limit,
or, with ``on_exceed="pause"``, the session waits in PAUSED_FOR_USER (``BudgetExceeded``) until
the user raises the turn's allowance or stops it (``BudgetDecided``, ``decide_budget``). Costs are
integer micro-dollars (see models/pricing).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal, Protocol

from . import events as ev
from .errors import ConfigurationError, InputError, NotAwaitingBudgetError
from .fold import SessionState
from .models.pricing import format_micros
from .states import Cause, SessionStatus
from .writer import SessionWriter

BudgetDecision = Literal["raise", "stop"]


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits in micro-dollars; None means no limit at that level."""

    per_turn_micros: int | None = None
    per_session_micros: int | None = None
    per_user_day_micros: int | None = None
    on_exceed: Literal["stop", "pause"] = "stop"
    """stop: the turn ends with a message naming the budget; pause: the session waits for the
    user to raise the turn's allowance or stop."""

    def __post_init__(self) -> None:
        if self.on_exceed not in ("stop", "pause"):
            raise ConfigurationError(f"Budget.on_exceed must be 'stop' or 'pause', not {self.on_exceed!r}")


class SpendLedger(Protocol):
    """What a user has spent on a (UTC) day, across all their sessions: a projection answers it."""

    def spent_micros(self, user_id: str, day: dt.date) -> int: ...


@dataclass(frozen=True, slots=True)
class BudgetStop:
    """Why a call may not be made: which budget, its limit, what is spent, what the call may cost."""

    level: str
    limit_micros: int
    spent_micros: int
    worst_case_micros: int

    def message(self) -> str:
        return (
            "I stopped before the next model call: it could cost up to "
            f"{format_micros(self.worst_case_micros)}, "
            f"and the {self.level} budget of {format_micros(self.limit_micros)} has "
            f"{format_micros(max(self.limit_micros - self.spent_micros, 0))} left "
            f"({format_micros(self.spent_micros)} spent). Raise the budget or start a smaller request."
        )


def check_budget(
    budget: Budget,
    state: SessionState,
    worst_case_micros: int,
    ledger: SpendLedger | None,
    today: dt.date,
) -> BudgetStop | None:
    """The first budget the next call could overrun, or None if every budget has room."""
    turn_spent = state.turn.cost_micros if state.turn else 0
    allowance = state.turn.budget_allowance_micros if state.turn else 0
    levels: list[tuple[str, int | None, int]] = [
        ("per-turn", budget.per_turn_micros, turn_spent),
        ("per-session", budget.per_session_micros, state.cost_micros),
    ]
    if budget.per_user_day_micros is not None and ledger is not None:
        levels.append(
            ("per-user daily", budget.per_user_day_micros, ledger.spent_micros(state.user_id, today))
        )
    for level, limit, spent in levels:
        if limit is not None and spent + worst_case_micros > limit + allowance:
            return BudgetStop(level, limit + allowance, spent, worst_case_micros)
    return None


def pause_for_budget(w: SessionWriter, stop: BudgetStop) -> None:
    """The call is not made; the session waits for the user's decision on the budget."""
    turn = w.state.turn
    assert turn is not None
    tid = turn.turn_id
    w.add(
        ev.BudgetExceeded,
        turn_id=tid,
        level=stop.level,
        limit_micros=stop.limit_micros,
        spent_micros=stop.spent_micros,
        worst_case_micros=stop.worst_case_micros,
        correlation_id=tid,
    )
    w.transition(
        SessionStatus.PAUSED_FOR_USER, Cause.BUDGET, detail=f"{stop.level} budget", correlation_id=tid
    )


def add_budget_decision(
    w: SessionWriter,
    decision: BudgetDecision,
    *,
    extra_micros: int = 0,
    note: str = "",
    actor: str = "user",
    event_id: str | None = None,
) -> None:
    """Raise the paused turn's allowance by ``extra_micros`` and go on, or stop the turn. Raises
    NotAwaitingBudgetError when no turn waits on a budget, InputError for a decision that is not
    one. ``event_id``: the id of a decision submitted through the inbox, which the owner writes."""
    state = w.state
    turn = state.turn
    if decision not in ("raise", "stop"):
        raise InputError(f"a budget decision is 'raise' or 'stop', not {decision!r}")
    if decision == "raise" and extra_micros <= 0:
        raise InputError("raising a budget needs extra_micros > 0 (micro-dollars the turn may spend more)")
    if turn is None or not turn.budget_pause or state.status is not SessionStatus.PAUSED_FOR_USER:
        raise NotAwaitingBudgetError(
            f"session {state.session_id} ({state.status}): no turn is waiting for a budget decision"
        )
    tid = turn.turn_id
    level = turn.budget_pause
    w.add(
        ev.BudgetDecided,
        turn_id=tid,
        decision=decision,
        extra_micros=extra_micros if decision == "raise" else 0,
        actor=actor,
        note=note,
        correlation_id=tid,
        **({"event_id": event_id} if event_id else {}),
    )
    if decision == "raise":
        detail = f"{level} budget raised by {format_micros(extra_micros)}"
        w.transition(SessionStatus.PROCESSING, Cause.USER_APPROVAL, detail=detail, correlation_id=tid)
        return
    text = f"I stopped here as you asked: the {level} budget is spent. {note}".strip()
    end_for_budget(w, text, f"{level} budget: stopped by the user")


def end_for_budget(w: SessionWriter, answer: str, detail: str) -> None:
    """The turn's last answer says why it ends, and the session finishes with cause budget
    (the caller adds the TurnFinished)."""
    tid = w.state.turn.turn_id if w.state.turn else ""
    w.add(ev.AssistantMessage, turn_id=tid, message_id=ev.new_id(), text=answer, correlation_id=tid)
    w.transition(SessionStatus.FINISHED, Cause.BUDGET, detail=detail, correlation_id=tid)
