"""One tool step of a turn: decide the batch the model asked for (run, refuse, wait for
approval, pace a crashed call: engine.tools.batch, engine.tools.recovery), record each start,
run the calls, and record the results and what follows them (guards, the snapshot).

Whether the starts are committed before the tools run is the ledger's rule
(``needs_commit_before``): a batch of first starts of idempotent tools without a key is not, so
a fast batch goes out in one commit with its results, and a slow one is committed once it has
run ``START_NOTICE_S`` (streams and a cancel see it running)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from . import events as ev
from . import interrupts
from . import snapshots as _snapshots
from .agent import Agent
from .context import builtins
from .fold import ToolCallProgress
from .log.base import EventLog
from .states import Cause, SessionStatus
from .steps import RunTools
from .stream import StreamItem
from .tools import Tool, batch, ledger, recovery
from .tools import execute as tool_exec
from .turn_records import add_tool_finished
from .writer import SessionWriter

S = SessionStatus
Clock = Callable[[], int]
"""Now, in ms since the epoch: what the crash rule's times are read against (engine.tools.recovery)."""
Runnable = list[tuple[ToolCallProgress, int, Tool, dict[str, Any]]]
"""A tool batch's calls to run: (call, attempts made before this run, tool, arguments)."""
START_NOTICE_S = 0.1
"""A tool batch whose starts need not be committed before it runs (needs_commit_before) has
them committed once it has run this long: a fast batch goes out in one commit with its results,
a slow one is seen running (streams, ``show``, a cancel) while it runs."""


@dataclass
class ToolStep:
    """What a tool step needs of its runner: the log (for the built-in tools' scope), the clock
    and the snapshot encoder."""

    log: EventLog
    clock: Clock
    snapshots: _snapshots.SnapshotEncoder | None

    async def run(self, step: RunTools, w: SessionWriter, agent: Agent) -> AsyncIterator[StreamItem]:
        """Run the batch ``step`` names: decide it, start its calls, record their results."""
        turn = w.state.turn
        assert turn is not None
        tid = turn.turn_id
        origin = w.state.origin_calls.get(turn.message_id, ())  # a fork's: what its origin started
        now = self.clock()
        registry = builtins.session_tools(agent, w.state)
        plan = batch.plan_batch(step.calls, registry, turn.history, origin, now_ms=now)
        if plan.paced_until is not None:  # a crashed call's next start is not due: wait, decide again
            await recovery.pause(plan.paced_until - now, w.state.session_id)
            return
        if plan.approvals and plan.trip is None:
            batch.request_approvals(w, tid, plan.approvals)
            return
        await recovery.settle(plan.prepared, key_of(w))
        results: dict[str, tuple[int, tool_exec.ToolOutcome]] = {}  # call_id -> (prior attempts, outcome)
        runnable = self._start(w, step.calls, plan.prepared, results)
        commit_first = needs_commit_before(runnable, w.recovered)
        if commit_first:
            for event in await w.commit():
                yield event
            if interrupts.stop_for(w.state, agent) is not None:
                return  # a stop slipped in before the tools could start: the next step is Stop
        outcomes: list[tool_exec.ToolOutcome] = []
        async for item in self._execute(w, agent, runnable, commit_first, outcomes):
            yield item
        if len(outcomes) < len(runnable):
            return  # a stop slipped in while the tools ran: the next step is Stop
        for (call, prior, _, _), outcome in zip(runnable, outcomes, strict=True):
            results[call.call_id] = (prior, outcome)
        for call in step.calls:  # results go back in the order the model asked for them
            prior, outcome = results[call.call_id]
            add_tool_finished(w, tid, call, outcome, attempts=prior + outcome.attempts)
            if outcome.status is tool_exec.ToolStatus.SUCCESS:
                builtins.events_for(w, agent, tid, call.call_id, call.tool_name, call.arguments_json)
        batch.after_batch(w, tid, len(step.calls), plan.trip, agent.max_tool_iterations)
        w.transition(S.PROCESSING, Cause.TOOL_RESULT, correlation_id=tid)
        if self.snapshots is not None:
            _snapshots.take(w, self.snapshots, correlation_id=tid, step=True)
        # nothing since the last commit that cannot run again if lost: the next model call need
        # not wait for the COMMIT of what it follows (it is made again, and so is the batch)
        w.redoable_pending = not commit_first and bool(runnable)

    def _start(
        self,
        w: SessionWriter,
        calls: tuple[ToolCallProgress, ...],
        prepared: dict[str, batch.Prepared],
        results: dict[str, tuple[int, tool_exec.ToolOutcome]],
    ) -> Runnable:
        """Record a start for each call that runs and return them; an outcome that replaces
        running a call (rejected, declined, interrupted) goes straight into ``results``."""
        tid = w.state.turn.turn_id if w.state.turn else ""
        runnable: Runnable = []  # the fold updates each `call` as events are added
        w.mark_boundary()
        for call in calls:
            ready = prepared[call.call_id]
            if isinstance(ready, tool_exec.ToolOutcome):
                results[call.call_id] = (call.attempts, ready)
                continue
            assert isinstance(ready, tuple), ready  # settled: nothing paced or to consult
            key = ledger.idempotency_key(w.state.session_id, tid, call.call_id)
            runnable.append((call, call.attempts, ready[0], ledger.with_key(*ready, key)))
            w.add(
                ev.ToolCallStarted,
                turn_id=tid,
                call_id=call.call_id,
                tool_name=call.tool_name,
                attempt=call.attempts + 1,
                idempotency_key=key,
                correlation_id=tid,
                time_ms=self.clock(),
            )
        return runnable

    async def _execute(
        self,
        w: SessionWriter,
        agent: Agent,
        runnable: Runnable,
        commit_first: bool,
        outcomes: list[tool_exec.ToolOutcome],
    ) -> AsyncIterator[StreamItem]:
        """Run the batch into ``outcomes``. A batch whose starts were not committed first has
        them committed once it has run ``START_NOTICE_S``, while it runs; if a stop slipped in
        then, its tools (all idempotent) are cancelled and ``outcomes`` stays empty."""
        scope = builtins.session_scope(self.log, w.state)
        try:
            if commit_first or not runnable:
                outcomes.extend(await _run_calls(runnable))
                return
            work = asyncio.ensure_future(_run_calls(runnable))
            try:
                await asyncio.sleep(0)  # a batch that does not wait finishes here: no timer needed
                if not work.done() and not await _finishes_within(work, START_NOTICE_S):
                    for event in await w.commit():  # a slow batch: every stream shows it running
                        yield event
                    if interrupts.stop_for(w.state, agent) is not None:
                        return
                outcomes.extend(await work)
            finally:
                if not work.done():
                    work.cancel()
        finally:
            builtins.end_scope(scope)


async def _run_calls(runnable: Runnable) -> list[tool_exec.ToolOutcome]:
    if len(runnable) == 1:  # no task per call when there is nothing to run concurrently
        return [await tool_exec.execute(runnable[0][2], runnable[0][3])]
    return list(await asyncio.gather(*(tool_exec.execute(t, args) for _, _, t, args in runnable)))


async def _finishes_within(work: asyncio.Future[Any], seconds: float) -> bool:
    """Whether ``work`` is done within ``seconds`` (it goes on either way). A timer and a
    done-callback on one future: ``asyncio.wait`` costs twice as much, on every tool step."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    timer = loop.call_later(seconds, wake)
    work.add_done_callback(wake)
    try:
        await woken
    finally:
        timer.cancel()
        work.remove_done_callback(wake)
    return work.done()


def needs_commit_before(runnable: Runnable, recovered: bool) -> bool:
    """Whether a tool batch's starts must be on the log before it runs (the ledger's rule).

    Not when every call is a first start of an idempotent tool without a key: if the worker
    dies mid-batch, its successor finds the model call that asked for the batch unanswered,
    records it interrupted and asks again, and the tools run again, which they allow. The
    answer, the starts and the results then go out in one commit with the next model call; a
    batch still running after ``START_NOTICE_S`` has its answer and starts committed then.
    A keyed tool needs its start on the log: a re-asked model may name new calls, so new keys,
    and the key's exactly-once promise would break. A re-run (attempt > 1) and every batch of
    a run that found a stopped worker's call (``recovered``) are committed first, so a tool
    that kills its worker meets the crash rule (engine.tools.recovery) instead of a crash
    loop. A batch with nothing to run has no side effect to commit before."""
    if recovered:
        return bool(runnable)
    return any(not t.idempotent or t.takes_idempotency_key or prior for _, prior, t, _ in runnable)


def key_of(w: SessionWriter) -> Callable[[str], str]:
    """A call's idempotency key in the writer's running turn, by call id."""
    sid, tid = w.state.session_id, w.state.turn.turn_id if w.state.turn else ""
    return lambda call_id: ledger.idempotency_key(sid, tid, call_id)
