"""The Python API (seed §6.2): create a session, send a message and stream its turn, read
history, invoke a tool, force-finish.

``post_user_message`` is the producer side only (append and return), for deployments where a
worker elsewhere runs the turns. ``send_user_message`` appends and then drives the same
TurnRunner in-process, streaming events as they are committed.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence

from . import events as ev
from . import expiry, interrupts
from .admission import AdmissionRules, admitted, agent_prices
from .agent import AgentDirectory
from .budget import BudgetDecision, SpendLedger, add_budget_decision
from .errors import (
    ConcurrencyError,
    DuplicateSubmissionError,
    InputError,
    LogUnavailableError,
    SessionClosedError,
    SessionNotFoundError,
)
from .fold import SessionState, fold
from .log.base import EventLog, LogRecord
from .messages import ChatMessage
from .models.endpoints import Endpoints
from .session_cache import DEFAULT_CACHE_BYTES
from .states import SessionStatus
from .stream import StreamItem
from .text import check_message_text
from .tools import ToolOutcome, approvals, invoke
from .tools.permissions import tools_for_role
from .turn import Clock, TurnRunner
from .turn_records import add_turn_finished
from .writer import SessionWriter

APPEND_RETRIES = 8
REQUEST_WAIT_S = 30.0
"""How long a request sent to another process's partition (force_finish) is waited for."""
MAX_MESSAGE_ID_CHARS = 128
"""A caller-chosen message id (an idempotency key for retries) is at most this long."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as ``AgentSessions.create_session`` returns it."""

    session_id: str
    agent_id: str
    user_id: str
    role: str
    status: str
    version: int
    record: LogRecord | None = None
    """The new session's first record, with its log position (``create_session``)."""


class AgentSessions:
    """The engine's front door for one log and a set of agents."""

    def __init__(
        self,
        log: EventLog,
        agents: AgentDirectory,
        *,
        producer: str = "api",
        spend_ledger: SpendLedger | None = None,
        clock: Clock = ev.now_ms,
        endpoints: Endpoints | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.log = log
        self.agents = agents
        self.producer = producer
        self.runner = TurnRunner(
            log, agents.get, producer=producer, spend_ledger=spend_ledger, clock=clock, endpoints=endpoints,
            cache_bytes=cache_bytes,
        )  # fmt: skip
        self.admission = AdmissionRules(agent_prices(agents))
        """What a request becomes on its session (engine.admission): applied here where this
        process appends, and by the log's owner to what others submit."""
        log.admit_with(self.admission)

    async def create_session(
        self,
        agent_id: str,
        user_id: str,
        *,
        role: str = "user",
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionInfo:
        agent = self.agents.get(agent_id)
        sid = session_id or ev.new_id()
        created = ev.SessionCreated(
            session_id=sid,
            version=1,
            agent_id=agent_id,
            user_id=user_id,
            role=role,
            model=agent.model.name,
            metadata_json=json.dumps(metadata or {}),
            producer=self.producer,
        )
        record = await self.on_log((await self.log.submit(created))[0], "the new session")
        self.runner.remember(fold(sid, [record.event]))  # its first request reads only what follows
        return SessionInfo(sid, agent_id, user_id, role, str(SessionStatus.IDLE), 1, record)

    async def on_log(self, submitted: LogRecord, what: str) -> LogRecord:
        """A submission's record once it is on the log. On Kafka, from a process that does not
        own the session's partition, that is when the owner sequenced it (a session must exist
        before the next request can name it); elsewhere it is already."""
        found = await self.log.sequenced(submitted, REQUEST_WAIT_S)
        if found is None:
            sid = submitted.event.session_id
            raise LogUnavailableError(
                f"session {sid}: {what} is on the log's inbox, but the owner of partition "
                f"{self.log.partition_of(sid)} has not sequenced it within "
                f"{REQUEST_WAIT_S:g} s; it will once a worker owns the partition: check that workers run."
            )
        return found

    async def post_user_message(
        self, session_id: str, text: str, *, message_id: str | None = None, state: SessionState | None = None
    ) -> LogRecord:
        """Submit a user message; it is durable and queued for a turn when this returns. Returns
        its record: the message with its version and log position.

        The log assigns its version (``EventLog.submit``); on Kafka, from a process that does not
        own the session's partition, the record is pending (``LogRecord.pending``: version 0, no
        position yet). A ``message_id`` chosen by the caller makes a retry safe: a message id the
        session already holds is not taken again, and the message already on the log is
        returned. ``state``: the session as the caller just folded it (``get_state``), which
        spares a read of the log. An expired session's successor takes it if the agent says so.
        """
        if message_id is not None and not 0 < len(message_id) <= MAX_MESSAGE_ID_CHARS:
            raise InputError(f"a message id is 1 to {MAX_MESSAGE_ID_CHARS} characters, not {len(message_id)}")
        if state is None:
            state = await self.runner.load(session_id)
        state = await expiry.open_target(self, state)  # raises for a closed session, or its successor
        self.check_message(state, text)
        event = ev.UserMessageReceived(
            session_id=state.session_id,
            version=0,
            message_id=message_id or ev.new_id(),
            text=text,
            user_id=state.user_id,
            producer=self.producer,
            basis_version=state.version,
        )
        return (await self.log.submit(event))[0]  # the message (a closed session's drop follows it)

    def check_message(self, state: SessionState, text: str) -> None:
        """Raise what posting ``text`` to the session would raise: closed, empty, not valid
        Unicode text (a lone surrogate, a NUL), too large."""
        if state.closed:
            raise expiry.closed_now(state)
        check_message_text(text, self.agents.get(state.agent_id).max_message_bytes)

    async def send_user_message(self, session_id: str, text: str) -> AsyncIterator[StreamItem]:
        """Append a user message and stream its turn (and any turns queued before it).

        The message is committed with the start of its turn; the first item streamed is its
        UserMessageReceived event, durable by then (in an expired session's successor, if its agent
        says so).
        """
        conflict: ConcurrencyError | None = None
        for _ in range(APPEND_RETRIES):
            streamed = False
            try:
                async for item in self.runner.run(session_id, message=text, check=self.check_message):
                    streamed = True
                    yield item
                return
            except SessionClosedError:
                if streamed:
                    raise
                session_id = (await expiry.open_target(self, await self.runner.load(session_id))).session_id
            except ConcurrencyError as exc:
                if streamed:  # the message was taken; the conflict came later in the turn
                    raise
                conflict = exc
        assert conflict is not None
        raise conflict

    async def run_pending(self, session_id: str) -> AsyncIterator[StreamItem]:
        """Stream the turns of messages already on the log that no turn has taken up yet."""
        async for item in self.runner.run(session_id):
            yield item

    async def get_state(self, session_id: str) -> SessionState:
        return await self.runner.load(session_id)

    async def get_history(self, session_id: str, limit: int = 20) -> list[ChatMessage]:
        """The last ``limit`` messages of the conversation, oldest first."""
        state = await self.runner.load(session_id)
        return list(state.messages[-limit:]) if limit > 0 else []

    async def invoke_tool(
        self,
        session_id: str,
        tool_name: str,
        arguments: dict[str, Any],
        *,
        actor: str = "api",
        confirmed: bool = False,
    ) -> ToolOutcome:
        """Run one of the session's tools directly: role filter, validation, timeout, retries.

        Recorded on the log as one ``ToolInvoked`` event (after the run, whatever its outcome);
        not part of the conversation the model sees. A tool outside the session's role is
        answered as unknown; a tool that requires approval runs only with ``confirmed=True``
        (the caller asked the user).
        """
        state = await self.runner.load(session_id)
        registry = tools_for_role(self.agents.get(state.agent_id).tools, state.role)
        outcome = await invoke.run_direct(registry, tool_name, arguments, confirmed=confirmed)
        await self._append(session_id, lambda w: invoke.add_invoked(w, tool_name, arguments, actor, outcome))
        return outcome

    async def decide_tool_call(
        self,
        session_id: str,
        call_id: str,
        decision: approvals.Decision,
        *,
        arguments: dict[str, Any] | None = None,
        note: str = "",
        actor: str = "user",
    ) -> AsyncIterator[StreamItem]:
        """Approve, edit (with ``arguments``, validated again) or reject a call waiting in
        PAUSED_FOR_USER, then stream the rest of the turn from exactly that point."""
        for record in await self.post_tool_decision(
            session_id, call_id, decision, arguments=arguments, note=note, actor=actor
        ):
            yield record.event
        async for item in self.runner.run(session_id):
            yield item

    async def post_tool_decision(
        self,
        session_id: str,
        call_id: str,
        decision: approvals.Decision,
        *,
        arguments: dict[str, Any] | None = None,
        note: str = "",
        actor: str = "user",
    ) -> list[LogRecord]:
        """Append the decision only (a TurnWorker continues the turn); returns what was written,
        with log positions.

        Where another process owns the session's partition (Kafka) the decision is checked here
        (the call waits, an edit passes the tool's schema) and submitted through the inbox; the
        owner writes it, and its record comes back pending (``LogRecord.pending``)."""
        state = await self.runner.load(session_id)
        registry = tools_for_role(self.agents.get(state.agent_id).tools, state.role)

        def build(w: SessionWriter) -> None:
            approvals.add_decision(
                w, registry, call_id, decision, arguments=arguments, note=note, actor=actor
            )

        if not self._owns(session_id):
            return await self._submit_decision(session_id, build)
        _, records = await self._admit(session_id, lambda state: self._decision(state, build))
        return records

    async def decide_budget(
        self,
        session_id: str,
        decision: BudgetDecision,
        *,
        extra_micros: int = 0,
        note: str = "",
        actor: str = "user",
    ) -> AsyncIterator[StreamItem]:
        """Answer a turn paused on its budget (``Budget(on_exceed="pause")``): ``raise`` lets it
        spend ``extra_micros`` more and streams the rest of the turn; ``stop`` ends it."""
        for record in await self.post_budget_decision(
            session_id, decision, extra_micros=extra_micros, note=note, actor=actor
        ):
            yield record.event
        async for item in self.runner.run(session_id):
            yield item

    async def post_budget_decision(
        self,
        session_id: str,
        decision: BudgetDecision,
        *,
        extra_micros: int = 0,
        note: str = "",
        actor: str = "user",
    ) -> list[LogRecord]:
        """Append the budget decision only (a TurnWorker continues the turn); on Kafka, from a
        process that does not own the partition, checked here and submitted through the inbox."""

        def build(w: SessionWriter) -> None:
            add_budget_decision(w, decision, extra_micros=extra_micros, note=note, actor=actor)
            if decision == "stop":
                add_turn_finished(w, "budget", self.runner.snapshots)

        if not self._owns(session_id):
            return await self._submit_decision(session_id, build)
        _, records = await self._admit(session_id, lambda state: self._decision(state, build))
        return records

    def _decision(self, state: SessionState, build: Callable[[SessionWriter], None]) -> ev.Event:
        """The decision ``build`` makes on ``state``, checked as it would be written (``build``
        raises what the owner would: the call waits, an edit passes the tool's schema), as the
        event to submit; the admission rules write it with what it moves."""
        w = SessionWriter(None, copy.deepcopy(state), self.producer)
        build(w)
        return dataclasses.replace(w.take_pending()[0], version=0)

    async def _submit_decision(
        self, session_id: str, build: Callable[[SessionWriter], None]
    ) -> list[LogRecord]:
        """Check a decision on the session's freshest fold and submit it for the owner to apply."""
        state = await self.runner.reload(session_id)
        return await self.log.submit(self._decision(state, build))

    async def _admit(
        self, session_id: str, request_for: Callable[[SessionState], ev.Event]
    ) -> tuple[SessionState, list[LogRecord]]:
        """Append what a request becomes by the admission rules (the owner's path): the request
        is made on the session's current fold (``request_for`` raises what refuses it early),
        admitted, and appended at the fold's version; made again on a conflict. Returns the fold
        with the request's events and their records."""
        async with self.runner.lock(session_id):
            for _ in range(APPEND_RETRIES):
                state = await self.runner.load(session_id)
                events = await admitted(self.log, self.admission, state, request_for(state))
                try:
                    records = await self.log.append(events, expected_version=state.version)
                except ConcurrencyError:
                    self.runner.forget(session_id)
                    continue
                return fold(session_id, events, state), records  # the cached fold follows the log
        raise ConcurrencyError(session_id, state.version, await self.log.session_version(session_id))

    async def _append(self, session_id: str, build: Callable[[SessionWriter], None]) -> Sequence[ev.Event]:
        """Add events with ``build`` on the current state and commit; rebuild on a conflict."""
        async with self.runner.lock(session_id):
            for _ in range(APPEND_RETRIES):
                state = await self.runner.load(session_id)
                w = SessionWriter(self.log, state, self.producer)
                try:
                    build(w)
                    return await w.commit()
                except ConcurrencyError:
                    self.runner.forget(session_id)
                except BaseException:
                    self.runner.forget(session_id)  # the writer may have folded ahead of the log
                    raise
        raise ConcurrencyError(session_id, state.version, await self.log.session_version(session_id))

    async def cancel(self, session_id: str, reason: str = "", *, actor: str = "user") -> interrupts.Cancelled:
        """Stop the running turn at its next step boundary (seed §8) and drop every message
        waiting for a turn (``interrupts.add_cancel``), without a new message; NoTurnRunningError
        when there is neither. Whoever runs the session (an in-process ``send_user_message``, a
        TurnWorker, ``run_pending``) stops the turn: CANCELLED, with what ran so far kept. Where
        another process owns the session's partition (Kafka), the owner applies the request from
        the inbox; this returns what it did once it is on the log."""
        reason = reason or "the user cancelled"
        if not self._owns(session_id):
            return await self._request_cancel(session_id, reason, actor)

        def request(state: SessionState) -> ev.Event:
            interrupts.check_cancel(state)
            return ev.CancelRequested(
                session_id=session_id, version=0, reason=reason, actor=actor, producer=self.producer
            )

        state, records = await self._admit(session_id, request)
        cancelled = interrupts.cancelled_by(records, state)
        self.runner.interrupt(session_id, cancelled.request.version)  # a model call in flight here stops now
        return cancelled

    async def _request_cancel(self, session_id: str, reason: str, actor: str) -> interrupts.Cancelled:
        """A cancel submitted through the inbox: the owner applies the rule to the session as it
        finds it, after every request submitted before (a message posted a moment ago may not be
        on this process's read of the log yet, so nothing but a close is refused here). A cancel
        the owner finds nothing to do for is on the log, stopping nothing, and raises
        NoTurnRunningError here as it would in the owner."""
        state = await self.runner.reload(session_id)
        if state.closed:
            raise SessionClosedError(session_id, state.close_reason)
        request = ev.CancelRequested(
            session_id=session_id,
            version=0,
            basis_version=state.version,
            reason=reason,
            actor=actor,
            producer=self.producer,
        )
        await self.log.submit(request)
        newer = await self._applied(request, state.version)
        return interrupts.cancelled_on_log(state, newer, request.event_id)

    async def _applied(self, request: ev.Event, basis: int) -> list[LogRecord]:
        """The session's records after ``basis`` once the owner has sequenced ``request`` (a
        submission from a process that does not own the partition). SessionClosedError if the
        session was closed first: the owner refuses the request then."""
        sid = request.session_id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REQUEST_WAIT_S
        while True:
            newer = await self.log.read_session_records(sid, basis)
            if any(r.event.event_id == request.event_id for r in newer):
                return newer
            closed = next((r.event for r in newer if isinstance(r.event, ev.SessionClosed)), None)
            if closed is not None:
                raise SessionClosedError(sid, closed.reason)
            left = deadline - loop.time()
            if left <= 0:
                raise LogUnavailableError(
                    f"session {sid}: the {request.type} is on the log's inbox, but the owner of partition "
                    f"{self.log.partition_of(sid)} has not applied it within {REQUEST_WAIT_S:g} s; it will "
                    "once a worker owns the partition: check that workers run."
                )
            await self.log.wait_for_session(sid, min(left, 0.2))

    def _owns(self, session_id: str) -> bool:
        """Whether this process may append to the session (always, except on Kafka where the
        owners' group assigns partitions; requests for the others go through the inbox)."""
        return self.log.partition_of(session_id) in self.log.owned_partitions()

    async def force_finish(self, session_id: str, reason: str, *, actor: str = "admin") -> SessionInfo:
        """Stop whatever the session is doing and close it (seed §6.2 force_finish).

        Where another process owns the session's partition (Kafka), the request goes through
        the log's inbox and the owner applies it (engine.log.kafka_inbox); this returns once
        the session is closed on the log."""
        if not self._owns(session_id):
            return await self._request_close(session_id, reason, actor)
        request = ev.SessionClosed(
            session_id=session_id, version=0, reason=reason, actor=actor, producer=self.producer
        )
        state, _ = await self._admit(session_id, lambda _state: request)
        return _info(state)

    async def expire(self, session_id: str, basis_version: int, now_ms: int) -> list[LogRecord]:
        """Close an idle session as expired if it is still at ``basis_version`` (engine.expiry);
        from a Kafka process that does not own it, through the inbox (the record is pending)."""
        request = expiry.request(session_id, basis_version, now_ms, self.producer)
        if not self._owns(session_id):
            return await self.log.submit(request)
        return (await self._admit(session_id, lambda _state: request))[1]

    async def _request_close(self, session_id: str, reason: str, actor: str) -> SessionInfo:
        state = await self.runner.reload(session_id)
        if state.closed:
            raise SessionClosedError(session_id, state.close_reason)
        request = ev.SessionClosed(
            session_id=session_id, version=0, reason=reason, actor=actor, producer=self.producer
        )
        await self.log.submit(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REQUEST_WAIT_S
        while loop.time() < deadline:
            current = await self.runner.reload(session_id)
            if current.closed:
                return _info(current)
            await self.log.wait_for_session(session_id, min(deadline - loop.time(), 0.2))
        raise LogUnavailableError(
            f"session {session_id}: the close request is on the log, but the owner of partition "
            f"{self.log.partition_of(session_id)} has not applied it within {REQUEST_WAIT_S:g} s; "
            "it will when a worker owns the partition. Check that turn workers are running."
        )

    async def record_erasure(self, erased: ev.SessionErased) -> None:
        """Put an erasure on the session's log (engine.erasure): an open session is force-finished
        in the same commit, its running turn stopped (on Kafka by the partition's owner, from the
        inbox). Idempotent by the event's id: a repeat finds it on the log and does nothing."""
        sid = erased.session_id
        try:
            if self._owns(sid):
                await self._admit(sid, lambda _state: erased)
                return
            if not (await self.runner.reload(sid)).exists:
                raise SessionNotFoundError(sid)
            await self.on_log((await self.log.submit(erased))[0], "the erasure")
        except DuplicateSubmissionError:
            return  # recorded by an earlier attempt


def _info(state: SessionState) -> SessionInfo:
    return SessionInfo(
        state.session_id, state.agent_id, state.user_id, state.role, str(state.status), state.version
    )
