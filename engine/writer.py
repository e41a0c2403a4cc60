"""Appends one session's events and keeps its folded state in step with them."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

from .errors import ConcurrencyError, LogError
from .events import E, Event, StateChanged
from .fold import SessionState
from .log.base import EventLog
from .states import Cause, SessionStatus

Rebase = Callable[["SessionWriter", list[Event]], Awaitable[list[Event]]]
"""Called when a commit loses the version race: append the batch on top of what slipped in,
or raise ConcurrencyError when it conflicts (engine.interrupts.Rebaser)."""


class SessionWriter:
    """Folds each new event into the state at once and appends the pending ones on ``commit``.

    The state runs ahead of the log only between an ``add`` and the next ``commit``, inside one
    step of one turn. If a commit fails the state no longer matches the log: the caller must drop
    it and fold again from the log (TurnRunner.run and AgentSessions do). Callers commit right
    before every side effect (a model call, running tools) and at the end, so everything a
    model or a tool acted on is on the log first: durable, except a redoable commit's (see
    ``redoable_pending``), which is redone if it is lost.

    A writer without a log (``log=None``) only builds events: an admission rule
    (engine.admission) hands them to whoever appends them.
    """

    def __init__(
        self, log: EventLog | None, state: SessionState, producer: str, *, rebase: Rebase | None = None
    ) -> None:
        self._log = log
        self.state = state
        self.producer = producer
        self.rebase = rebase
        self.basis = state.version
        """The last version read from the log; every event added carries it as basis_version."""
        self.boundary: int | None = None
        """Index in the pending batch where a step's side-effect starts begin (mark_boundary)."""
        self.recovered = False
        """This run met a model call a stopped worker left unanswered: from then on every tool
        batch is committed before it runs (engine.tool_step.needs_commit_before)."""
        self.redoable_pending = False
        """What is pending was all recorded by work that can be redone if it is lost (an
        idempotent tool batch that needed no commit before it, and the model answer that asked
        for it): the commit before the next model call may then return before it is durable
        (EventLog.append's ``redoable``). Every commit clears it."""
        self._pending: list[Event] = []

    @property
    def log(self) -> EventLog:
        if self._log is None:
            raise LogError("this SessionWriter only builds events (no log was given); append them yourself")
        return self._log

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
            basis_version=self.basis,
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

    def mark_boundary(self) -> None:
        """What is added from here on starts a side effect (a model call, tools); a rebase
        over a stop request drops it (engine.interrupts)."""
        self.boundary = len(self._pending)

    def take_pending(self) -> list[Event]:
        batch, self._pending = self._pending, []
        return batch

    def queue(self, event: Event) -> None:
        """Queue an event already folded into ``state`` (a rebase re-adds a batch this way)."""
        self._pending.append(event)

    async def commit(self, *, redoable: bool = False) -> Sequence[Event]:
        """Append the pending events as one atomic batch; durable when this returns, unless
        ``redoable`` (see EventLog.append: then the log may return before it is).

        If another writer appended first and a ``rebase`` is set, it gets the chance to put
        the batch on top (it may swap ``state`` for a fresh fold); otherwise, or when it
        cannot, ConcurrencyError propagates and the caller must fold again from the log.
        """
        batch = self.take_pending()
        self.redoable_pending = False
        if batch:
            try:
                await self.log.append(batch, expected_version=batch[0].version - 1, redoable=redoable)
            except ConcurrencyError:
                if self.rebase is None:
                    raise
                batch = await self.rebase(self, batch)
        self.boundary = None
        self.basis = self.state.version
        return batch
