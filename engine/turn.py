"""The turn loop (seed §6.3): one driver for every way a turn runs.

``TurnRunner.run(session_id)`` folds the session and repeatedly asks ``next_step`` what the
folded state calls for: start a turn for the oldest waiting message, call the model, run the
requested tools, or nothing. Because the next step is derived from the log alone, the same code
continues a turn after a crash: recorded model answers and tool results are reused, a started
idempotent or keyed tool is run again (with its key; paced, and given up if it keeps killing
its workers: engine.tools.recovery), and a started one without either is reported as
interrupted (engine.tools.ledger).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import weakref
from typing import AsyncIterator, Callable

import structlog

from . import events as ev
from . import interrupts, usage
from . import snapshots as _snapshots
from .agent import Agent
from .budget import BudgetStop, SpendLedger, check_budget, end_for_budget, pause_for_budget
from .context import builtins
from .context.manager import ContextManager
from .errors import (
    ConcurrencyError,
    ContextLengthError,
    SessionNotFoundError,
    SnapshotFormatError,
)
from .events import ToolCallSpec
from .fold import SessionState, TurnProgress, fold
from .log.base import EventLog
from .model_call import CallOutcome, LiveCalls, stream_call
from .models.base import ModelRequest, ModelResponse
from .models.endpoints import Endpoints
from .session_cache import DEFAULT_CACHE_BYTES, STATE_BYTES, Kind, SessionCache, history_bytes
from .states import Cause, SessionStatus
from .steps import (
    CallModel,
    Done,
    DropWaiting,
    RunTools,
    StartTurn,
    Step,
    Stop,
    build_request,
    ended_by_final_tool,
    next_step,
    stop_reason,
)
from .stream import StreamItem
from .tool_step import Clock, ToolStep, key_of
from .tools import recovery
from .turn_records import add_turn_finished, drop_waiting
from .writer import SessionWriter

S = SessionStatus
MessageCheck = Callable[[SessionState, str], None]
"""Accepts a new user message for a session or raises (too large, session closed...)."""
log = structlog.get_logger("turnlog.turn")
REFOLDS = 8
"""Times a run folds again after a conflicting event slipped in, before giving up."""


STATE: Kind[SessionState] = Kind("state")
"""The folded state of a session, in the runner's ``SessionCache``."""


class TurnRunner:
    """Runs the turns of sessions on one log. Keeps what it folded and encoded of each session
    in a cache bounded by memory (engine.session_cache), so a turn reads only the events
    appended since the last one (flat per-turn cost)."""

    def __init__(
        self,
        log: EventLog,
        agents: Callable[[str], Agent],
        *,
        producer: str = "worker",
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        snapshots: bool = True,
        spend_ledger: SpendLedger | None = None,
        clock: Clock = ev.now_ms,
        endpoints: Endpoints | None = None,
    ) -> None:
        self.log = log
        self.endpoints = endpoints or Endpoints()
        """The process's model endpoints (breakers, client-side limits), handed to the agents'
        models with every request; give every runner of a process the same one."""
        self.agents = agents
        self.producer = producer
        self.cache = SessionCache(cache_bytes)
        """What the runner keeps of each session between turns, at most ``cache_bytes``."""
        self.snapshots = _snapshots.SnapshotEncoder(self.cache) if snapshots else None
        """Writes a snapshot after every tool step and turn end; None turns them off (benchmarks)."""
        self.spend_ledger = spend_ledger
        """Answers what a user spent today, for per-user daily budgets."""
        self.clock = clock
        """Stamps tool starts and decides when a crashed call starts again or is given up
        (engine.tools.recovery); tests inject one that runs ahead of the wall clock."""
        self.tools = ToolStep(log, clock, self.snapshots)
        """Runs the tool steps of this runner's turns."""
        self.context = ContextManager(log, self.cache, self.endpoints)
        """Keeps every model step within the agent's context budgets (seed §3)."""
        # one lock per session while someone holds or waits for it; dropped after, so a worker
        # that sees millions of sessions does not keep millions of locks
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._live: LiveCalls = {}
        """Each session's model call in flight in this process, with its turn's start version."""
        self.draining = False
        """Set when the process stops: every run returns at its next step boundary, with what it
        did committed, and leaves the rest of its turn on the log for a successor."""

    async def load(self, session_id: str) -> SessionState:
        """The session's state, caught up with the log."""
        state = self.cache.get(session_id, STATE)
        self.cache.discard(session_id, STATE)  # a fold that fails leaves nothing half-folded
        if state is None:
            state = await self._from_snapshot(session_id)
        newer = await self.log.read_session(session_id, state.version if state else 0)
        state = fold(session_id, newer, state)
        if not state.exists:
            raise SessionNotFoundError(session_id)
        if any(type(e) is ev.SessionErased for e in newer):  # the fold scrubbed itself: so does the cache
            self.cache.discard(session_id)  # encoded messages, token counts, trim candidates
        self.remember(state)
        return state

    def remember(self, state: SessionState) -> None:
        """Cache ``state``, a fold of the session's events as the log holds them (a session
        this process just created starts there, so loading it reads only what came after)."""
        self.cache.put(state.session_id, STATE, state, STATE_BYTES + history_bytes(state.messages))

    async def _from_snapshot(self, session_id: str) -> SessionState | None:
        """The latest snapshot's state, or None to fold from the start (none, or unreadable)."""
        try:
            return await _snapshots.load_latest(self.log, session_id)
        except SnapshotFormatError as exc:
            log.warning("load.snapshot_unreadable", session=session_id, error=str(exc))
            return None

    async def reload(self, session_id: str) -> SessionState:
        """Drop the cached state and fold the session again from the log."""
        self.forget(session_id)
        return await self.load(session_id)

    def forget(self, session_id: str) -> None:
        self.cache.discard(session_id, STATE)

    def lock(self, session_id: str) -> asyncio.Lock:
        """Serialises this process's writers of one session (the log's version check guards
        against writers in other processes)."""
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def run(
        self, session_id: str, *, message: str | None = None, check: MessageCheck | None = None
    ) -> AsyncIterator[StreamItem]:
        """Advance the session until nothing is left to do, streaming what happens.

        With ``message``, a new user message is added first (after ``check`` accepts it) and
        committed together with the start of its turn: one commit fewer than appending it alone.
        Every item streamed follows a successful commit, so once one has been yielded the
        message is durable (its commit is never a redoable one); a ConcurrencyError before that
        means it was not taken.
        """
        async with self.lock(session_id):
            streamed = False
            try:
                for attempt in range(REFOLDS):
                    try:
                        async for item in self._advance(session_id, message, check):
                            streamed = True
                            yield item
                        return
                    except ConcurrencyError:
                        # something that conflicts with our decision slipped in (an admin's
                        # force-finish, a cancel, another worker): it stands; fold and decide again
                        self.forget(session_id)
                        if (message is not None and not streamed) or attempt == REFOLDS - 1:
                            raise
                        message = None  # it was committed with what we streamed
                        log.info("turn.refold", session=session_id, attempt=attempt + 1)
            except BaseException:
                self.forget(session_id)  # reload from the log next time
                raise

    async def _advance(
        self, session_id: str, message: str | None, check: MessageCheck | None
    ) -> AsyncIterator[StreamItem]:
        state = await self.load(session_id)
        agent = self.agents(state.agent_id)
        rebase = interrupts.Rebaser(agent, lambda: self.reload(session_id), self.snapshots)
        writer = SessionWriter(self.log, state, self.producer, rebase=rebase)
        if message is not None:
            if check is not None:
                check(state, message)
            writer.add(ev.UserMessageReceived, message_id=ev.new_id(), text=message, user_id=state.user_id)
        while not isinstance(step := next_step(writer.state, agent), Done):
            if self.draining:
                log.info("turn.drained", session=session_id, next_step=type(step).__name__)
                break
            async for item in self._perform(step, writer, agent):
                yield item
        for event in await writer.commit():
            yield event

    async def _perform(
        self, step: StartTurn | CallModel | RunTools | Stop | DropWaiting, w: SessionWriter, agent: Agent
    ) -> AsyncIterator[StreamItem]:
        """One step. Events are folded as they are added and committed right before each side
        effect (calling the model, running tools) and when the loop ends."""
        if isinstance(step, DropWaiting):
            reason = w.state.close_reason
            drop_waiting(w, "closed", f"the session was closed ({reason}) before this message arrived")
            return
        if isinstance(step, StartTurn):
            self._start_turn(step, w)
            await self.context.start_turn(w, agent)
            return
        if isinstance(step, Stop):
            open_call = await usage.open_model_call(self.log, w.state)
            calls = w.state.turn.tool_calls.values() if w.state.turn else ()
            known = await recovery.stopped_outcomes(calls, builtins.session_tools(agent, w.state), key_of(w))
            interrupts.stop_turn(
                w, step, agent.model.name, self.snapshots,
                open_call=open_call, prices=agent.prices, known=known,
            )  # fmt: skip
            return
        steps = (
            self.tools.run(step, w, agent) if isinstance(step, RunTools) else self._call_model(step, w, agent)
        )
        async for item in steps:
            yield item

    def _start_turn(self, step: StartTurn, w: SessionWriter) -> None:
        inbound = w.state.inbox[0]
        turn_id = ev.new_id()
        w.add(
            ev.TurnStarted,
            turn_id=turn_id,
            message_id=step.message_id,
            causation_id=inbound.event_id,
            correlation_id=turn_id,
        )
        w.transition(S.PROCESSING, Cause.USER_MESSAGE, detail=step.message_id, correlation_id=turn_id)

    async def _call_model(self, step: CallModel, w: SessionWriter, agent: Agent) -> AsyncIterator[StreamItem]:
        turn = w.state.turn
        assert turn is not None
        if turn.model_call_open:  # a worker stopped during the last call: it is recorded, then made again
            w.recovered = True
            started_before = await usage.open_model_call(self.log, w.state)
            if started_before is not None:
                reason = "the worker running it stopped before it answered; the call is made again"
                usage.add_unfinished_call(w, started_before, "interrupted", reason, agent.prices)
        index = turn.model_calls_started
        prepared = await self._fit_and_check(step, w, agent, index)
        if prepared is None:
            return  # a budget stopped the turn before the call
        request, estimated = prepared
        w.mark_boundary()
        w.add(
            ev.ModelCallStarted,
            turn_id=turn.turn_id,
            step=index,
            model=agent.model.model_for(request),
            message_count=len(request.messages),
            tools_offered=len(request.tools),
            estimated_input_tokens=estimated,
            section_tokens_json=json.dumps(self.context.section_tokens(w.state, agent, request)),
            correlation_id=turn.turn_id,
        )
        for event in await w.commit(redoable=w.redoable_pending):  # after a batch that may run again
            yield event
        if interrupts.stop_for(w.state, agent) is not None:
            return  # a stop slipped in before the call could start: the next step is Stop
        call = CallOutcome(index, estimated)
        async for item in stream_call(w, agent, request, call, self._live):
            yield item
        if call.stopped:  # a cancel stopped it: record what it cost, then meet the cancel on the log
            self._record_stopped(w, agent, call)
            for event in await w.commit():
                yield event
            return
        await self._record_outcome(w, agent, step, call)

    async def _fit_and_check(
        self, step: CallModel, w: SessionWriter, agent: Agent, index: int
    ) -> tuple[ModelRequest, int] | None:
        """The request for model step ``index`` (the context fitted first) and its size, or None
        when a cost budget stops or pauses the turn instead."""
        await self.context.fit(w, agent, index)
        request = self._request(w.state, agent, step.closing)
        estimated = await agent.model.estimate_input_tokens(request)
        stop = self._budget_stop(w.state, agent, estimated)
        if stop is not None and await self.context.fit(w, agent, index, force="budget"):
            # a shorter context may fit what is left of the budget (seed §5.3)
            request = self._request(w.state, agent, step.closing)
            estimated = await agent.model.estimate_input_tokens(request)
            stop = self._budget_stop(w.state, agent, estimated)
        if stop is None:
            return request, estimated
        if agent.budget is not None and agent.budget.on_exceed == "pause":
            pause_for_budget(w, stop)
        else:
            self._stop_for_budget(w, stop)
        return None

    async def _record_outcome(
        self, w: SessionWriter, agent: Agent, step: CallModel, call: CallOutcome
    ) -> None:
        turn = w.state.turn
        assert turn is not None
        error, response = call.error, call.response
        if isinstance(error, ContextLengthError) and turn.context_retries == 0:
            # the provider counts differently: compact and call once more, not a failed turn
            self._record_call_failed(w, agent, call)
            if await self.context.fit(w, agent, call.index + 1, force="context_length"):
                return
            self._fail_turn(w, _failure_reason(error))
        elif error is not None or response is None:
            self._record_call_failed(w, agent, call)
            self._fail_turn(w, _failure_reason(error))
        else:
            closing, retries = step.closing, call.switches
            self._record_model_answer(w, agent, call.index, call.latency_ms, response, closing, retries)

    def interrupt(self, session_id: str, after_version: int) -> bool:
        """Stop the session's model call now if it belongs to a turn that started before
        ``after_version`` (a cancel's version: a cancel never stops a later turn). The call is
        recorded cancelled with what it cost; the turn then stops at its step boundary."""
        running = self._live.get(session_id)
        if running is None or running[1] >= after_version:
            return False
        running[0].stop()
        return True

    def _budget_stop(self, state: SessionState, agent: Agent, estimated_tokens: int) -> BudgetStop | None:
        if agent.budget is None or agent.prices is None:
            return None
        price = agent.prices.price_for(agent.model.name)
        if price is None:
            return None
        worst = price.worst_case_micros(estimated_tokens)
        return check_budget(agent.budget, state, worst, self.spend_ledger, dt.datetime.now(dt.UTC).date())

    def _stop_for_budget(self, w: SessionWriter, stop: BudgetStop) -> None:
        """The turn ends before a call that could overrun a budget, and the user is told which."""
        end_for_budget(w, stop.message(), f"{stop.level} budget")
        self._finish_turn(w, "budget")

    def _request(self, state: SessionState, agent: Agent, closing: bool) -> ModelRequest:
        return build_request(state, agent, closing, self.endpoints)

    def _record_call_failed(self, w: SessionWriter, agent: Agent, call: CallOutcome) -> None:
        """A call that failed: what was sent and what streamed before it did, estimated."""
        counter = agent.model.token_counter
        spent = usage.unanswered(agent.prices, agent.model.name, call.sent_tokens, call.streamed, counter)
        tid = w.state.turn.turn_id if w.state.turn else ""
        usage.add_call_finished(
            w, tid, call.index, agent.model.name, "failed", spent,
            latency_ms=call.latency_ms, retries=call.switches, error=_failure_reason(call.error),
        )  # fmt: skip

    def _record_stopped(self, w: SessionWriter, agent: Agent, call: CallOutcome) -> None:
        """A call a cancel stopped: the provider's usage if its answer had arrived anyway (it is
        not used), else what was sent and what streamed before the stop, estimated."""
        response = call.response
        if response is not None:
            spent = usage.priced(agent.prices, [response.model, agent.model.name], response.usage)
        else:
            counter = agent.model.token_counter
            spent = usage.unanswered(agent.prices, agent.model.name, call.sent_tokens, call.streamed, counter)
        tid = w.state.turn.turn_id if w.state.turn else ""
        usage.add_call_finished(
            w, tid, call.index, agent.model.name, "cancelled", spent,
            latency_ms=call.latency_ms, retries=call.switches, error="stopped by a cancel while it ran",
        )  # fmt: skip

    def _fail_turn(self, w: SessionWriter, reason: str) -> None:
        tid = w.state.turn.turn_id if w.state.turn else ""
        w.transition(S.ERROR, Cause.MODEL_ERROR, detail=reason, correlation_id=tid)
        self._finish_turn(w, "model_error")

    def _record_model_answer(
        self,
        w: SessionWriter,
        agent: Agent,
        index: int,
        latency: float,
        response: ModelResponse,
        closing: bool,
        retries: int,
    ) -> None:
        turn = w.state.turn
        assert turn is not None
        tid = turn.turn_id
        calls = () if closing else unique_call_ids(response.tool_calls, turn)
        text = response.text
        guard, reason = stop_reason(turn, agent.max_tool_iterations)
        stopped = closing and not ended_by_final_tool(turn, agent)
        unanswered = not calls and not text.strip()
        if unanswered:  # the engine answers from the results rather than leave the user nothing
            opening = f"I stopped to avoid a loop ({reason})" if stopped else "The model wrote no answer"
            text = _gathered_summary(w.state, opening)
        iteration = turn.iterations + 1
        spent = usage.priced(agent.prices, [response.model, agent.model.name], response.usage)
        usage.add_call_finished(
            w, tid, index, response.model or agent.model.name, "ok", spent,
            latency_ms=latency, retries=retries, finish_reason=response.finish_reason,
        )  # fmt: skip
        w.add(
            ev.AssistantMessage,
            turn_id=tid,
            message_id=ev.new_id(),
            text=text,
            tool_calls=calls,
            correlation_id=tid,
        )
        if not calls:
            if not stopped:
                w.transition(S.FINISHED, Cause.MODEL_ANSWER, correlation_id=tid)
                self._finish_turn(w, "no_answer" if unanswered else "answered")
                return
            # every loop guard is cause `guard`, named in the detail (`iteration_cap` is in older logs)
            w.transition(S.FINISHED, Cause.GUARD, detail=f"{guard}: {reason}", correlation_id=tid)
            self._finish_turn(w, guard)
            return
        for call in calls:
            w.add(
                ev.ToolCallRequested,
                turn_id=tid,
                call_id=call.call_id,
                tool_name=call.name,
                arguments_json=call.arguments_json,
                iteration=iteration,
                correlation_id=tid,
            )
        waiting = S.TOOL_WAIT if iteration == 1 else S.TOOL_LOOP
        w.transition(
            waiting, Cause.MODEL_TOOL_CALL, detail=", ".join(c.name for c in calls), correlation_id=tid
        )

    def _finish_turn(self, w: SessionWriter, reason: str) -> None:
        add_turn_finished(w, reason, self.snapshots)


def _failure_reason(error: Exception | None) -> str:
    return f"{type(error).__name__}: {error}" if error else "no response"


def unique_call_ids(calls: tuple[ToolCallSpec, ...], turn: TurnProgress) -> tuple[ToolCallSpec, ...]:
    """The calls with ids unique within the turn: some models number their calls afresh on
    every step ("call_0"), and a call id must name one call (results, approvals, projections)."""
    used = {r.call_id for r in turn.history} | set(turn.tool_calls)
    unique = []
    for call in calls:
        call_id = call.call_id or f"call_{ev.new_id()[:24]}"
        if call_id in used:
            call_id = f"{call_id}~{ev.new_id()[:8]}"
        used.add(call_id)
        unique.append(call if call_id == call.call_id else dataclasses.replace(call, call_id=call_id))
    return tuple(unique)


def _gathered_summary(state: SessionState, opening: str) -> str:
    # this turn's results: everything after its user message (a batch may hold several calls)
    start = max((i for i, m in enumerate(state.messages) if m.role == "user"), default=-1) + 1
    results = [m for m in state.messages[start:] if m.role == "tool"]
    lines = [f"- {m.name}: {m.content[:300]}" for m in results]
    return f"{opening}, so this answer may be incomplete. Here is what the tools returned:\n" + "\n".join(
        lines
    )


__all__ = [
    "CallModel",
    "build_request",
    "Done",
    "DropWaiting",
    "RunTools",
    "StartTurn",
    "Stop",
    "Step",
    "TurnRunner",
    "next_step",
]
