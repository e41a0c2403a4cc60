"""One tool batch of a turn, decided over the folded state (pure, so a resumed turn decides the
same): which calls run, which are refused (unknown to the role, invalid, declined, interrupted,
stopped by the repeated-call guard), which wait for approval; and, once results are in, which
earlier results they supersede and whether a loop guard stops the turn.

The turn loop (engine/turn.py) runs the batch; this module only decides and writes events.
Not imported by ``turnlog.engine.tools`` itself: it needs the writer and the fold, which import tools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .. import events as ev
from ..fold import ToolCallProgress
from ..states import Cause, SessionStatus
from ..writer import SessionWriter
from . import execute as tool_exec
from . import guards, recovery
from .registry import Tool, ToolRegistry

S = SessionStatus

Prepared = tool_exec.ToolOutcome | tuple[Tool, dict[str, Any]] | recovery.Consult | recovery.Paced
"""What a call of a batch comes to: its outcome without running, the tool and arguments to run,
a lookup to ask first (``recovery.settle`` turns it into one of the two), or not yet."""


@dataclass(slots=True)
class BatchPlan:
    prepared: dict[str, Prepared]
    """call_id -> the tool and arguments to run, or the outcome that replaces running it."""
    approvals: list[tuple[ToolCallProgress, Tool]]
    """Calls that must wait for the user's decision before the batch runs."""
    trip: guards.Trip | None = None

    @property
    def paced_until(self) -> int | None:
        """When the latest re-start the crash rule paces is due (None: none is paced)."""
        due = [p.until_ms for p in self.prepared.values() if isinstance(p, recovery.Paced)]
        return max(due) if due else None


def plan_batch(
    calls: tuple[ToolCallProgress, ...],
    registry: ToolRegistry,
    history: list[guards.CallRecord],
    origin_calls: Sequence[guards.CallRecord] = (),
    *,
    now_ms: int,
) -> BatchPlan:
    """Decide per call, in the order asked: refuse, stop by the repeated-call guard, wait for
    approval, or run. Pure over the folded state and ``now_ms`` (the crash rule's clock), so a
    resumed turn decides the same. ``origin_calls``: in a fork, what its origin had started
    answering this turn's message."""
    plan = BatchPlan({}, [])
    seen = list(history)
    for call in calls:
        prepared = precheck(call, registry, now_ms)
        if isinstance(prepared, tuple):
            prepared = ran_in_origin(call, prepared, origin_calls) or prepared
        if isinstance(prepared, tuple):
            trip = guards.repeated_call(seen, call.tool_name, call.arguments_json)
            if trip is not None:
                plan.trip = plan.trip or trip
                prepared = tool_exec.rejected(
                    f"{call.tool_name} was not run: {trip.reason}. Stop calling tools and answer.",
                    f"loop guard: {trip.guard}",
                )
            elif prepared[0].requires_approval and not call.approval:
                plan.approvals.append((call, prepared[0]))
        plan.prepared[call.call_id] = prepared
        seen.append(
            guards.CallRecord(call.call_id, call.tool_name, call.arguments_json, call.iteration, "", "")
        )
    if plan.trip is not None:  # the turn stops: nothing waits for an approval it will not use
        for call, _ in plan.approvals:
            plan.prepared[call.call_id] = tool_exec.rejected(
                f"{call.tool_name} was not run: the loop guard stopped this turn.", "loop guard"
            )
    return plan


def request_approvals(w: SessionWriter, tid: str, pending: list[tuple[ToolCallProgress, Tool]]) -> None:
    for call, t in pending:
        w.add(
            ev.ApprovalRequested,
            turn_id=tid,
            call_id=call.call_id,
            tool_name=call.tool_name,
            arguments_json=call.arguments_json,
            sensitivity=str(t.sensitivity),
            reason=f"{t.name} requires the user's approval ({t.sensitivity} sensitivity)",
            correlation_id=tid,
        )
    names = ", ".join(c.tool_name for c, _ in pending)
    w.transition(S.PAUSED_FOR_USER, Cause.APPROVAL_REQUIRED, detail=names, correlation_id=tid)


def after_batch(w: SessionWriter, tid: str, count: int, trip: guards.Trip | None, cap: int) -> None:
    """Mark results this batch superseded, then check the loop guards on the turn's calls."""
    turn = w.state.turn
    assert turn is not None
    history = turn.history
    earlier = history[:-count]
    for record in history[-count:]:
        for old in guards.superseded(earlier, record):
            if old not in w.state.superseded:
                w.add(
                    ev.ToolResultSuperseded,
                    turn_id=tid,
                    call_id=old,
                    superseded_by=record.call_id,
                    correlation_id=tid,
                )
    trip = trip or guards.unchanged_result(history) or guards.iteration_cap(turn.iterations, cap)
    if trip is not None:
        w.add(
            ev.LoopGuardTriggered,
            turn_id=tid,
            guard=str(trip.guard),
            reason=trip.reason,
            tool_name=trip.tool_name,
            correlation_id=tid,
        )


def ran_in_origin(
    call: ToolCallProgress, prepared: tuple[Tool, dict[str, Any]], origin_calls: Sequence[guards.CallRecord]
) -> tool_exec.ToolOutcome | None:
    """In a fork, a call of a tool that is not idempotent which its origin had already started
    with near-equal arguments for the same message: not run again (its effect happened there, or
    may have); the model is told what the origin got."""
    if prepared[0].idempotent:
        return None
    for done in origin_calls:
        if done.tool_name == call.tool_name and guards.near_equal(done.arguments_json, call.arguments_json):
            got = done.result[:500] if done.status != "started" else "no result: it was still running"
            return tool_exec.rejected(
                f"{call.tool_name} was not run: the session this one was forked from already ran it with "
                f"these arguments (call {done.call_id}, {done.status}; it got: {got}). A fork never repeats "
                "a side effect of its origin; answer from that result.",
                f"ran in the fork's origin as call {done.call_id}",
            )
    return None


def precheck(call: ToolCallProgress, registry: ToolRegistry, now_ms: int) -> Prepared:
    """The tool and arguments of a call that may run now, or the outcome that replaces running it.

    ``registry`` is the session role's view: a tool outside it is unknown, whatever the route."""
    t = registry.get(call.tool_name)
    if t is not None and call.status == "started":  # a worker stopped while it ran
        return after_crash(call, t, registry, now_ms)
    if t is not None and call.approval == "rejected":
        return tool_exec.declined(call.tool_name, call.approval_note)
    return tool_exec.prepare(registry, call.tool_name, call.arguments_json)


def after_crash(call: ToolCallProgress, t: Tool, registry: ToolRegistry, now_ms: int) -> Prepared:
    """A call a stopped worker left started (engine.tools.recovery): interrupted if its tool is
    not resumable; else run again, later, or given up, a keyed tool's lookup asked first."""
    if not t.resumable:
        return tool_exec.interrupted(call.tool_name)
    verdict = recovery.after_crash(t, call, now_ms)
    if isinstance(verdict, recovery.Paced):
        return verdict
    span = recovery.span_s(call, now_ms)
    if verdict == "give_up":
        if t.lookup is None:
            return tool_exec.abandoned(t, call.attempts, span)
        return recovery.Consult(t, None, call.attempts, span)
    run = tool_exec.prepare(registry, call.tool_name, call.arguments_json)
    if t.lookup is None or isinstance(run, tool_exec.ToolOutcome):
        return run
    return recovery.Consult(t, run, call.attempts, span)
