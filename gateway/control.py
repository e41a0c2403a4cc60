"""Routes that steer a session's running turn: cancel it, interrupt it with a new message, decide a
tool call that waits for approval. Each appends to the log and answers 202 with what it appended
(with log positions); whoever runs the session (a TurnWorker) carries the turn on from there."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, get_args

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine import events as ev
from engine.errors import InputError, MessageTooLargeError, NoTurnRunningError, SessionClosedError
from engine.fold import SessionState
from engine.tools.approvals import Decision

from .access import appended, owned_state
from .http import HttpError, json_body, optional_string, principal_of

if TYPE_CHECKING:
    from .service import Gateway

DECISIONS: tuple[str, ...] = get_args(Decision)


class ControlRoutes:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    async def cancel(self, request: Request) -> Response:
        """Stop the running turn at its next step boundary (CANCELLED, what ran is kept)."""
        state = await owned_state(self.gw, request)
        body = await json_body(request, self.gw.limits.max_message_bytes)
        reason = optional_string(body, "reason")
        actor, reason = self._actor(request, state, reason)
        event = await self.gw.api.cancel(state.session_id, reason, actor=actor)
        return JSONResponse({"events": await appended(self.gw, [event])}, 202)

    async def interrupt(self, request: Request) -> Response:
        """A new message that stops the running turn (seed §8): a cancel of the running turn, then
        the message, which starts the next turn. With no turn running it is a plain message.

        The cancel goes first so it can only ever stop the turn that was running: a message
        appended first could start its own turn before the cancel lands."""
        state = await owned_state(self.gw, request)
        body = await json_body(request, self.gw.limits.max_message_bytes)
        text = body.get("text")
        if not isinstance(text, str):
            raise HttpError(422, "invalid_input", "'text' must be a string")
        self._check_message(state, text)
        written: list[ev.Event] = []
        if state.turn is not None:
            actor, reason = self._actor(request, state, "interrupted by a new message")
            try:
                written.append(await self.gw.api.cancel(state.session_id, reason, actor=actor))
            except NoTurnRunningError:
                pass  # the turn ended meanwhile: nothing to stop
        written.append(await self.gw.api.post_user_message(state.session_id, text))
        events = await appended(self.gw, written)
        return JSONResponse({"interrupted": len(written) == 2, "events": events}, 202)

    async def decide(self, request: Request) -> Response:
        """Approve, edit (new arguments, validated against the tool) or reject a paused call."""
        state = await owned_state(self.gw, request)
        call_id = request.path_params["call_id"]
        body = await json_body(request, self.gw.limits.max_message_bytes)
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
        _check_waiting(state, call_id)
        events = await self.gw.api.post_tool_decision(
            state.session_id,
            call_id,
            decision,
            arguments=arguments,
            note=note,
            actor=principal_of(request).user,
        )
        return JSONResponse({"events": await appended(self.gw, events)}, 202)

    # -- helpers -------------------------------------------------------------------------------

    def _actor(self, request: Request, state: SessionState, reason: str) -> tuple[str, str]:
        """The owner stops their turn as themselves; an admin stopping another user's turn is
        recorded as "admin" (the engine's cause ``admin``), with their name in the reason."""
        user = principal_of(request).user
        if user == state.user_id:
            return user, reason
        return "admin", f"{reason or 'cancelled'} ({user})"

    def _check_message(self, state: SessionState, text: str) -> None:
        """The checks ``post_user_message`` makes, before the cancel, so a message that would be
        refused stops nothing."""
        if state.closed:
            raise SessionClosedError(state.session_id, state.close_reason)
        if not text.strip():
            raise InputError("the message is empty; send some text")
        size, limit = len(text.encode("utf-8")), self.gw.api.agents.get(state.agent_id).max_message_bytes
        if size > limit:
            raise MessageTooLargeError(size, limit)


def _check_waiting(state: SessionState, call_id: str) -> None:
    """Tell an unknown call from one that is known but not waiting (the engine checks again when
    it appends, so a decision racing another one still gets a 409)."""
    if state.closed:
        raise SessionClosedError(state.session_id, state.close_reason)
    if any(c.call_id == call_id for c in state.pending_approvals):
        return
    waiting = ", ".join(f"{c.call_id} ({c.tool_name})" for c in state.pending_approvals) or "none"
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
