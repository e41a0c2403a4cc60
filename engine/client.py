"""A producer that needs no agent code: ``SessionClient`` knows agents by id only.

``AgentSessions`` holds the agents themselves (their models, their tools), so only a process
that can build them can use it. A producer (a web backend, a batch job, another service) only
names an agent: it creates a session, posts a message, and waits for that message's turn or
streams it, while turn workers elsewhere run it. Everything goes through the log, so it works
across processes on both backends (on Kafka through the inbox, from a process that owns no
partition).

A session's state reads FINISHED both before a queued message is picked up and after its turn,
so "the turn is over" is not a state to poll for. The client follows the session's log instead:
the message's turn is the one whose ``TurnStarted`` names the message id, and it is over at the
``TurnFinished`` that names it. Waiting polls the log every ``poll_s`` (a write in another
process wakes nobody here) and is bounded by ``timeout``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

from . import events as ev
from . import expiry, snapshots
from .agent import DEFAULT_MAX_MESSAGE_BYTES
from .errors import (
    InputError,
    LogUnavailableError,
    SessionClosedError,
    SessionNotFoundError,
    SnapshotFormatError,
    TurnWaitTimeoutError,
)
from .fold import SessionState, fold
from .log.base import EventLog, LogRecord
from .session import MAX_MESSAGE_ID_CHARS, REQUEST_WAIT_S, SessionInfo
from .states import SessionStatus
from .text import check_message_text

DEFAULT_TURN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class TurnResult:
    """How one message's turn ended."""

    session_id: str
    message_id: str
    turn_id: str
    reason: str
    """TurnFinished.reason: answered, cancelled, forced, budget, model_error, a loop guard..."""
    answer: str
    """The turn's last assistant text ("" if it wrote none)."""
    events: list[ev.Event]
    """The turn's events, from its TurnStarted to its TurnFinished."""


class SessionClient:
    """Create sessions, post messages and follow their turns on ``log``, with no agent code."""

    def __init__(
        self,
        log: EventLog,
        *,
        producer: str = "client",
        poll_s: float = 0.2,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.log = log
        self.producer = producer
        self.poll_s = poll_s
        self.max_message_bytes = max_message_bytes
        """Messages above this are refused here; a worker's agent may have a lower limit."""

    async def create_session(
        self,
        agent_id: str,
        user_id: str,
        *,
        role: str = "user",
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        model: str = "",
    ) -> SessionInfo:
        """Open a session of the agent ``agent_id``; returns once it is on the log. The agent is
        not checked here (the client has none): a worker without it refuses the turns."""
        if not agent_id:
            raise InputError("name the agent the session is for")
        created = ev.SessionCreated(
            session_id=session_id or ev.new_id(),
            version=1,
            agent_id=agent_id,
            user_id=user_id,
            role=role,
            model=model,
            metadata_json=json.dumps(metadata or {}),
            producer=self.producer,
        )
        on_log = await self.log.sequenced((await self.log.submit(created))[0], REQUEST_WAIT_S)
        if on_log is None:
            raise LogUnavailableError(
                f"session {created.session_id} was submitted but is not on the log in {REQUEST_WAIT_S:g} s; "
                "check that turn workers run (on Kafka, the owner of its partition sequences it)"
            )
        return SessionInfo(created.session_id, agent_id, user_id, role, str(SessionStatus.IDLE), 1)

    async def post_message(
        self, session_id: str, text: str, *, message_id: str | None = None
    ) -> ev.UserMessageReceived:
        """Submit a user message (durable when this returns); a ``message_id`` of your own makes
        a retry safe. Returns the event: pass it to ``wait_for_turn`` or ``stream_turn``."""
        state = await self._state(session_id)
        if state.closed:  # an expired session's successor needs its agent's settings: AgentSessions
            raise await expiry.closed_error(self.log, state)
        self._check(text, message_id)
        event = ev.UserMessageReceived(
            session_id=session_id,
            version=0,
            message_id=message_id or ev.new_id(),
            text=text,
            user_id=state.user_id,
            producer=self.producer,
            basis_version=state.version,
        )
        submitted = (await self.log.submit(event))[0].event  # version 0 while not sequenced (Kafka)
        assert isinstance(submitted, ev.UserMessageReceived)
        return submitted

    async def stream_turn(
        self, message: ev.UserMessageReceived, *, timeout: float = DEFAULT_TURN_TIMEOUT_S
    ) -> AsyncIterator[LogRecord]:
        """The message's turn as it is committed, record by record, from its TurnStarted to its
        TurnFinished (earlier turns it waits behind are skipped). Raises SessionClosedError if the
        session closes before the turn starts, TurnWaitTimeoutError past ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        cursor = message.version - 1 if message.version > 0 else message.basis_version
        started = False
        while True:
            for record in await self.log.read_session_records(message.session_id, cursor):
                cursor = record.event.version
                event = record.event
                if isinstance(event, ev.TurnStarted) and event.message_id == message.message_id:
                    started = True
                if started:
                    yield record
                    if isinstance(event, ev.TurnFinished) and event.message_id == message.message_id:
                        return
                elif isinstance(event, ev.SessionClosed):
                    raise SessionClosedError(
                        message.session_id, f"{event.reason} (before the message's turn)"
                    )
            left = deadline - loop.time()
            if left <= 0:
                raise TurnWaitTimeoutError(
                    f"session {message.session_id}: the turn of message {message.message_id} did not "
                    f"{'end' if started else 'start'} within {timeout:g} s; check that turn workers run"
                )
            await self.log.wait_for_append(min(left, self.poll_s))

    async def wait_for_turn(
        self, message: ev.UserMessageReceived, *, timeout: float = DEFAULT_TURN_TIMEOUT_S
    ) -> TurnResult:
        """Wait for the message's turn to end and say how it did."""
        events = [record.event async for record in self.stream_turn(message, timeout=timeout)]
        start, finish = events[0], events[-1]
        assert isinstance(start, ev.TurnStarted) and isinstance(finish, ev.TurnFinished)
        texts = [e.text for e in events if isinstance(e, ev.AssistantMessage) and e.text]
        return TurnResult(
            message.session_id,
            message.message_id,
            start.turn_id,
            finish.reason,
            texts[-1] if texts else "",
            events,
        )

    async def ask(
        self,
        session_id: str,
        text: str,
        *,
        message_id: str | None = None,
        timeout: float = DEFAULT_TURN_TIMEOUT_S,
    ) -> TurnResult:
        """Post a message and wait for its turn."""
        return await self.wait_for_turn(
            await self.post_message(session_id, text, message_id=message_id), timeout=timeout
        )

    async def _state(self, session_id: str) -> SessionState:
        """The session folded from its newest snapshot (no agent needed)."""
        try:
            state = await snapshots.load_latest(self.log, session_id)
        except SnapshotFormatError:  # a snapshot this version cannot read: fold from the start
            state = None
        state = fold(
            session_id, await self.log.read_session(session_id, state.version if state else 0), state
        )
        if not state.exists:
            raise SessionNotFoundError(session_id)
        return state

    def _check(self, text: str, message_id: str | None) -> None:
        if message_id is not None and not 0 < len(message_id) <= MAX_MESSAGE_ID_CHARS:
            raise InputError(f"a message id is 1 to {MAX_MESSAGE_ID_CHARS} characters, not {len(message_id)}")
        check_message_text(text, self.max_message_bytes)


__all__ = ["SessionClient", "TurnResult"]
