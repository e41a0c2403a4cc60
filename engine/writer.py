"""Appends one session's events and keeps its folded state in step with them."""

from __future__ import annotations

from typing import Any, Sequence

from .events import E, Event, StateChanged
from .fold import SessionState
from .log.base import EventLog
from .states import Cause, SessionStatus


class SessionWriter:
    """Folds each new event into the state at once and appends the pending ones on ``commit``.

    The state runs ahead of the log only between an ``add`` and the next ``commit``, inside one
    step of one turn. If a commit fails the state no longer matches the log: the caller must drop
    it and fold again from the log (TurnRunner.run and AgentSessions do). Callers commit right
    before every side effect (a model call, running tools) and at the end, so everything a
    model or a tool acted on is durable first.
    """

    def __init__(self, log: EventLog, state: SessionState, producer: str) -> None:
        self.log = log
        self.state = state
        self.producer = producer
        self._pending: list[Event] = []

    def add(
        self,
        cls: type[E],
        *,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        **payload: Any,
    ) -> E:
        """Create the session's next event, fold it in, and queue it for the next commit."""
        event = cls(
            session_id=self.state.session_id,
            version=self.state.version + 1,
            producer=self.producer,
            correlation_id=correlation_id,
            causation_id=causation_id,
            **payload,
        )
        self.state.apply(event)  # validates order and the transition table
        self._pending.append(event)
        return event

    def transition(
        self, to: SessionStatus, cause: Cause, *, detail: str = "", correlation_id: str | None = None
    ) -> None:
        self.add(
            StateChanged,
            from_state=str(self.state.status),
            to_state=str(to),
            cause=str(cause),
            detail=detail,
            correlation_id=correlation_id,
        )

    async def commit(self) -> Sequence[Event]:
        """Append the pending events as one atomic batch; durable when this returns."""
        batch, self._pending = self._pending, []
        if batch:
            await self.log.append(batch, expected_version=batch[0].version - 1)
        return batch
