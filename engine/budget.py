"""Cost budgets (seed §5.3): per turn, per session, per user per day.

Before each model call the engine prices the worst case (the request as estimated, plus the
model's whole output allowance) and compares it with what is left of every budget that applies.
A call that could overrun is not made: the turn stops with a message that names the budget, so
spending never silently runs past a limit. Costs are integer micro-dollars (see models/pricing).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

from .fold import SessionState
from .models.pricing import format_micros


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits in micro-dollars; None means no limit at that level."""

    per_turn_micros: int | None = None
    per_session_micros: int | None = None
    per_user_day_micros: int | None = None


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
    levels: list[tuple[str, int | None, int]] = [
        ("per-turn", budget.per_turn_micros, turn_spent),
        ("per-session", budget.per_session_micros, state.cost_micros),
    ]
    if budget.per_user_day_micros is not None and ledger is not None:
        levels.append(
            ("per-user daily", budget.per_user_day_micros, ledger.spent_micros(state.user_id, today))
        )
    for level, limit, spent in levels:
        if limit is not None and spent + worst_case_micros > limit:
            return BudgetStop(level, limit, spent, worst_case_micros)
    return None
