"""The events that close a tool call, a turn and a session, written one way whoever closes them:
the turn loop, a stop (a cancel or an interrupting message, engine.interrupts), an admin's
force-finish (``AgentSessions.force_finish``, or a Kafka partition's owner applying one sent
through the inbox, engine.log.kafka_inbox)."""

from __future__ import annotations

from . import events as ev
from . import snapshots, usage
from .fold import ToolCallProgress
from .models.pricing import PriceTable
from .states import Cause, SessionStatus
from .tools import execute as tool_exec
from .writer import SessionWriter


def add_tool_finished(
    w: SessionWriter, turn_id: str, call: ToolCallProgress, outcome: tool_exec.ToolOutcome, *, attempts: int
) -> None:
    w.add(
        ev.ToolCallFinished,
        turn_id=turn_id,
        call_id=call.call_id,
        tool_name=call.tool_name,
        status=str(outcome.status),
        content=outcome.content,
        output_json=outcome.output_json,
        elapsed_ms=outcome.elapsed_ms,
        attempts=attempts,
        error=outcome.error,
        correlation_id=turn_id,
    )


def add_turn_finished(w: SessionWriter, reason: str, encoder: snapshots.SnapshotEncoder | None) -> None:
    """TurnFinished with the turn's totals, then (unless snapshots are off) the turn-end snapshot."""
    turn = w.state.turn
    assert turn is not None
    w.add(
        ev.TurnFinished,
        turn_id=turn.turn_id,
        message_id=turn.message_id,
        reason=reason,
        iterations=turn.iterations,
        model_calls=turn.model_calls,
        input_tokens=turn.input_tokens,
        output_tokens=turn.output_tokens,
        cost_micros=turn.cost_micros,
        correlation_id=turn.turn_id,
    )
    if encoder is not None:
        snapshots.take(w, encoder, correlation_id=turn.turn_id)


def add_force_finish(
    w: SessionWriter,
    reason: str,
    actor: str,
    encoder: snapshots.SnapshotEncoder | None,
    *,
    event_id: str | None = None,
    open_call: ev.ModelCallStarted | None = None,
    prices: PriceTable | None = None,
) -> None:
    """Stop whatever the session is doing and close it (seed §6.2 force_finish): FINISHED, the
    running turn finished as forced, SessionClosed (with ``event_id`` if given: the id of the
    request it answers), every message still waiting dropped with the reason, then a snapshot
    if a turn was cut short. A model call the turn had open (``open_call``) is recorded
    cancelled with what was sent, priced by ``prices``."""
    state = w.state
    turn = state.turn
    if turn is not None and turn.model_call_open and open_call is not None:
        usage.add_unfinished_call(w, open_call, "cancelled", f"closed by {actor}: {reason}", prices)
    if state.status != SessionStatus.FINISHED:
        w.transition(SessionStatus.FINISHED, Cause.ADMIN, detail=reason)
    if turn is not None:
        w.add(
            ev.TurnFinished,
            turn_id=turn.turn_id,
            message_id=turn.message_id,
            reason="forced",
            iterations=turn.iterations,
            model_calls=turn.model_calls,
            input_tokens=turn.input_tokens,
            output_tokens=turn.output_tokens,
            cost_micros=turn.cost_micros,
            correlation_id=turn.turn_id,
        )
    closing = {"event_id": event_id} if event_id is not None else {}
    w.add(ev.SessionClosed, reason=reason, actor=actor, **closing)
    drop_waiting(w, "closed", f"the session was closed by {actor} ({reason}) before a turn took this message")
    if turn is not None and encoder is not None:
        snapshots.take(w, encoder)  # a forced turn end is a turn end too


def drop_waiting(
    w: SessionWriter, reason: str, detail: str, *, causation_id: str | None = None
) -> list[ev.UserMessageDropped]:
    """A UserMessageDropped for every message waiting in the inbox: none of them will be
    answered (the session is closed, a fork rests, a cancel), and the log says so."""
    return [
        w.add(
            ev.UserMessageDropped,
            message_id=message.message_id,
            reason=reason,
            detail=detail,
            causation_id=causation_id,
        )
        for message in list(w.state.inbox)
    ]
