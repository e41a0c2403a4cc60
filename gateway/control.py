"""Routes that steer a session's running turn: cancel it (and the messages waiting for a turn),
interrupt it with a new message, decide a tool call that waits for approval or a turn paused on
its budget. Each appends to the log and answers 202 with what it appended (with log positions);
whoever runs the session (a TurnWorker) carries the turn on from there."""

from __future__ import annotations

from typing import Any, get_args

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from turnlog.engine import events as ev
from turnlog.engine.budget import BudgetDecision
from turnlog.engine.errors import NoTurnRunningError, SessionClosedError
from turnlog.engine.fold import SessionState
from turnlog.engine.interrupts import Cancelled
from turnlog.engine.log.base import LogRecord
from turnlog.engine.tools.approvals import Decision

from .access import owned_state, written
from .bodies import json_body
from .http import HttpError, int_field, optional_string, principal_of
from .parts import GatewayParts

DECISIONS: tuple[str, ...] = get_args(Decision)
BUDGET_DECISIONS: tuple[str, ...] = get_args(BudgetDecision)
MAX_EXTRA_MICROS = 10**15
"""The most a budget may be raised by at once: a billion dollars, in micro-dollars."""


class ControlRoutes:
    def __init__(self, gw: GatewayParts) -> None:
        self.gw = gw

    async def cancel(self, request: Request) -> Response:
        """Stop the running turn at its next step boundary (CANCELLED, what ran is kept) and drop
        the messages waiting for a turn; the answer names the turn and the messages."""
        state = await owned_state(self.gw, request)
        body = await json_body(request, self.gw.limits)
        reason = optional_string(body, "reason")
        actor, reason = self._actor(request, state, reason)
        cancelled = await self.gw.api.cancel(state.session_id, reason, actor=actor)
        return JSONResponse(self._cancel_answer(cancelled), 202)

    async def interrupt(self, request: Request) -> Response:
        """A new message that stops the running turn (seed §8): a cancel (which also drops the
        messages waiting for a turn), then the message, which starts the next turn. With no turn
        running and no message waiting it is a plain message.

        The cancel goes first so it can only ever stop the turn that was running and drop the
        messages sent before: a message appended first could start its own turn, or be dropped,
        before the cancel lands."""
        state = await owned_state(self.gw, request)
        body = await json_body(request, self.gw.limits)
        text = body.get("text")
        if not isinstance(text, str):
            raise HttpError(422, "invalid_input", "'text' must be a string")
        cancelled: Cancelled | None = None
        if not state.closed:  # a closed session runs nothing; the post says why (or continues it)
            self.gw.api.check_message(state, text)  # a message that would be refused stops nothing
            actor, reason = self._actor(request, state, "interrupted by a new message")
            try:  # whoever may append decides what there is to stop, on the session as it finds
                # it: on Kafka the owner, after a message posted a moment ago and not yet on the
                # log this process read
                cancelled = await self.gw.api.cancel(state.session_id, reason, actor=actor)
            except NoTurnRunningError:
                pass  # no turn runs and no message waits: nothing to stop or drop
        posted = await self.gw.api.post_user_message(state.session_id, text)
        if cancelled is None:
            answer = {"stopped_turn": None, "dropped": [], "events": written(self.gw, [posted])}
        else:
            answer = self._cancel_answer(cancelled, then=posted)
        return JSONResponse({"interrupted": answer["stopped_turn"] is not None, **answer}, 202)

    async def decide(self, request: Request) -> Response:
        """Approve, edit (new arguments, validated against the tool) or reject a paused call."""
        state = await owned_state(self.gw, request)
        call_id = request.path_params["call_id"]
        body = await json_body(request, self.gw.limits)
        decision = body.get("decision")
        if decision not in DECISIONS:
            raise HttpError(422, "invalid_input", f"'decision' must be one of {', '.join(DECISIONS)}")
        arguments = body.get("arguments")
        if decision == "edit" and not isinstance(arguments, dict):
            raise HttpError(
                422, "invalid_input", "'arguments' must be a JSON object: the call's new arguments"
            )
        if decision != "edit" and arguments is not None:
            raise HttpError(422, "invalid_input", f"'arguments' is only for an edit, not for {decision!r}")
        note = optional_string(body, "note", max_chars=2000)
        await _check_waiting(self.gw, state, call_id)
        records = await self.gw.api.post_tool_decision(
            state.session_id,
            call_id,
            decision,
            arguments=arguments,
            note=note,
            actor=principal_of(request).user,
        )
        return JSONResponse({"events": written(self.gw, records)}, 202)

    async def decide_budget(self, request: Request) -> Response:
        """Raise the allowance of a turn paused on its budget (``extra_micros`` more) or stop it."""
        state = await owned_state(self.gw, request)
        body = await json_body(request, self.gw.limits)
        decision = body.get("decision")
        if decision not in BUDGET_DECISIONS:
            raise HttpError(422, "invalid_input", f"'decision' must be one of {', '.join(BUDGET_DECISIONS)}")
        extra = int_field({"extra_micros": 0, **body}, "extra_micros", high=MAX_EXTRA_MICROS)
        if decision == "raise" and extra == 0:
            raise HttpError(422, "invalid_input", "raising a budget needs 'extra_micros' > 0 (micro-dollars)")
        if state.closed:
            raise SessionClosedError(state.session_id, state.close_reason)
        records = await self.gw.api.post_budget_decision(
            state.session_id,
            decision,
            extra_micros=extra,
            note=optional_string(body, "note", max_chars=2000),
            actor=principal_of(request).user,
        )
        return JSONResponse({"events": written(self.gw, records)}, 202)

    # -- helpers -------------------------------------------------------------------------------

    def _cancel_answer(self, cancelled: Cancelled, then: LogRecord | None = None) -> dict[str, Any]:
        """What a cancel did: the turn it stops, the messages it dropped, and the events (with
        ``then``, the record written after it)."""
        records = [*cancelled.records, *([then] if then is not None else [])]
        return {
            "stopped_turn": cancelled.stopped_turn,
            "dropped": [d.message_id for d in cancelled.dropped],
            "events": written(self.gw, records),
        }

    def _actor(self, request: Request, state: SessionState, reason: str) -> tuple[str, str]:
        """The owner stops their turn as themselves; an admin stopping another user's turn is
        recorded as "admin" (the engine's cause ``admin``), with their name in the reason."""
        user = principal_of(request).user
        if user == state.user_id:
            return user, reason
        return "admin", f"{reason or 'cancelled'} ({user})"


async def _check_waiting(gw: GatewayParts, state: SessionState, call_id: str) -> None:
    """A decision on a call that does not wait for one: 409 if the call is known (decided
    already, in this turn or an earlier one, or never needing a decision), 404 if the session
    has no such call. The engine checks again when it appends, so a decision racing another
    one still gets a 409."""
    if state.closed:
        raise SessionClosedError(state.session_id, state.close_reason)
    if any(c.call_id == call_id for c in state.pending_approvals):
        return
    waiting = ", ".join(f"{c.call_id} ({c.tool_name})" for c in state.pending_approvals) or "none"
    asked, decided = await _approval_of(gw, state.session_id, call_id)
    if asked is not None and decided is not None:
        raise HttpError(
            409,
            "not_awaiting_approval",
            f"tool call {call_id!r} ({asked.tool_name}) was already decided: {decided.decision} by "
            f"{decided.actor} (version {decided.version}); it waits for no decision now; waiting: {waiting}",
        )
    known: dict[str, Any] = dict(state.turn.tool_calls) if state.turn is not None else {}
    if call_id in known:
        call = known[call_id]
        raise HttpError(
            409,
            "not_awaiting_approval",
            f"tool call {call_id!r} ({call.tool_name}) is not waiting for a decision "
            f"(approval: {call.approval or 'not needed'}, status: {call.status}); waiting: {waiting}",
        )
    raise HttpError(
        404,
        "unknown_call",
        f"session {state.session_id} has no tool call {call_id!r} waiting for a decision; waiting: {waiting}",
    )


async def _approval_of(
    gw: GatewayParts, session_id: str, call_id: str
) -> tuple[ev.ApprovalRequested | None, ev.ApprovalDecided | None]:
    """The call's last approval request and the decision on it, from the log (the fold keeps only
    the running turn's calls). Read only when a decision is refused."""
    asked: ev.ApprovalRequested | None = None
    decided: ev.ApprovalDecided | None = None
    for event in await gw.log.read_session(session_id):
        if isinstance(event, ev.ApprovalRequested) and event.call_id == call_id:
            asked, decided = event, None
        elif isinstance(event, ev.ApprovalDecided) and event.call_id == call_id:
            decided = event
    return asked, decided
