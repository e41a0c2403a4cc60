"""Appends one session's events and keeps its folded state in step with the log."""

from __future__ import annotations

from typing import Any, Sequence

from .events import E, Event, StateChanged
from .fold import SessionState
from .log.base import EventLog
from .states import Cause, SessionStatus, check_transition


class SessionWriter:
    """Buffers events for the session's next versions; ``commit`` appends them atomically.

    The state is only changed by folding events that the log accepted, so it never runs ahead
    of what is durable. A ConcurrencyError from the log means another writer owns the session.
    """

    def __init__(self, log: EventLog, state: SessionState, producer: str) -> None:
        self.log = log
        self.state = state
        self.producer = producer
        self._pending: list[Event] = []
        self._status = state.status

    @property
    def status(self) -> SessionStatus:
        """The state after the buffered events."""
        return self._status

    def add(
        self,
        cls: type[E],
        *,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        **payload: Any,
    ) -> E:
        event = cls(
            session_id=self.state.session_id,
            version=self.state.version + len(self._pending) + 1,
            producer=self.producer,
            correlation_id=correlation_id,
            causation_id=causation_id,
            **payload,
        )
        self._pending.append(event)
        return event

    def transition(
        self, to: SessionStatus, cause: Cause, *, detail: str = "", correlation_id: str | None = None
    ) -> None:
        check_transition(self._status, to, cause)
        self.add(
            StateChanged,
            from_state=str(self._status),
            to_state=str(to),
            cause=str(cause),
            detail=detail,
            correlation_id=correlation_id,
        )
        self._status = to

    async def commit(self) -> Sequence[Event]:
        """Append the buffered events (durable on return) and fold them into the state."""
        batch, self._pending = self._pending, []
        if not batch:
            return batch
        try:
            await self.log.append(batch, expected_version=self.state.version)
        except BaseException:
            self._status = self.state.status
            raise
        for event in batch:
            self.state.apply(event)
        return batch
