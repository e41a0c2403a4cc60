"""One model call of a turn: the model's stream turned into what the caller sees (answer text as
it streams, progress while nothing visible streams) and what the log records along the way (a
fallback to another model, a correction the model got).

Answer text goes out as ``ModelDelta`` and never enters the log; ``ModelProgress`` says, about once
a second, how many chunks the model has produced so far (on llama.cpp one chunk is one token), also
while it writes a tool call, which streams no text; ``ModelWaiting`` says the call waits for its
endpoint's client-side limits. A change of an endpoint's breaker that this call caused is recorded
in its session (``ModelBreakerChanged``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from . import events as ev
from .agent import Agent
from .errors import ModelError
from .models.base import (
    BreakerChange,
    EndpointWait,
    ModelCorrection,
    ModelRequest,
    ModelResponse,
    ModelSwitch,
    TextDelta,
)
from .models.limits import stream_within
from .stream import ModelDelta, ModelProgress, ModelWaiting, StreamItem
from .usage import LiveCall
from .writer import SessionWriter

PROGRESS_EVERY_S = 1.0


@dataclass(slots=True)
class CallOutcome:
    """One model call of a turn: its step and what was sent, then what came back (its answer or
    its error, what streamed, fallbacks, how long it took, whether a cancel stopped it)."""

    index: int
    sent_tokens: int
    """The request's size counted before sending (ModelCallStarted.estimated_input_tokens)."""
    started: float = field(default_factory=time.perf_counter)
    response: ModelResponse | None = None
    error: Exception | None = None
    switches: int = 0
    """Fallbacks to another model during the call."""
    streamed: str = ""
    latency_ms: float = 0.0
    stopped: bool = False
    """A cancel stopped it (TurnRunner.interrupt)."""


LiveCalls = dict[str, tuple[LiveCall, int]]
"""The model call running in each session, with the version its turn started at (a cancel stops
only a call of a turn that started before it)."""


async def stream_call(
    w: SessionWriter, agent: Agent, request: ModelRequest, outcome: CallOutcome, live_calls: LiveCalls
) -> AsyncIterator[StreamItem]:
    """Call the model within the agent's time limits, registered in ``live_calls`` while it runs
    (so a cancel can stop it at once); fill ``outcome``; never raise a model failure."""
    session_id = w.state.session_id
    turn = w.state.turn
    turn_id = turn.turn_id if turn else ""
    step = outcome.index
    last_progress = outcome.started
    chunks = 0
    live = LiveCall(stream_within(agent.model, request, agent.first_token_timeout_s, agent.model_timeout_s))
    live_calls[session_id] = (live, turn.started_version if turn else 0)
    try:
        async for chunk in live.chunks():
            if isinstance(chunk, TextDelta):
                chunks += 1
                if chunk.text:  # an empty delta only says the model is producing something
                    yield ModelDelta(session_id, turn_id, step, chunk.text)
                now = time.perf_counter()
                if now - last_progress >= PROGRESS_EVERY_S:
                    last_progress = now
                    yield ModelProgress(session_id, turn_id, step, chunks, round(now - outcome.started, 1))
            elif isinstance(chunk, ModelSwitch):
                outcome.switches += 1
                record_switch(w, step, chunk)
            elif isinstance(chunk, ModelCorrection):
                record_correction(w, step, chunk)
            elif isinstance(chunk, EndpointWait):
                yield ModelWaiting(
                    session_id, turn_id, step, chunk.model, chunk.reason, chunk.ahead, not chunk.over
                )
            elif isinstance(chunk, BreakerChange):
                record_breaker(w, step, chunk)
            else:
                outcome.response = chunk
        if outcome.response is None and not live.stopped:
            raise ModelError(f"{agent.model.name} ended its stream without a complete message")
    except Exception as exc:  # any model failure is recorded, never a crashed worker
        outcome.error = exc
    finally:
        if live_calls.get(session_id, (None,))[0] is live:
            del live_calls[session_id]
    outcome.stopped = live.stopped
    outcome.streamed = "".join(live.streamed)
    outcome.latency_ms = round((time.perf_counter() - outcome.started) * 1000, 3)


def record_switch(w: SessionWriter, step: int, switch: ModelSwitch) -> None:
    tid = w.state.turn.turn_id if w.state.turn else ""
    w.add(
        ev.ModelFallback,
        turn_id=tid,
        step=step,
        from_model=switch.from_model,
        to_model=switch.to_model,
        reason=switch.reason,
        degraded=switch.degraded,
        cause=switch.cause,
        correlation_id=tid,
    )


def record_breaker(w: SessionWriter, step: int, change: BreakerChange) -> None:
    """An endpoint's breaker changed because of this call: recorded in its session."""
    tid = w.state.turn.turn_id if w.state.turn else ""
    w.add(
        ev.ModelBreakerChanged,
        turn_id=tid,
        step=step,
        model=change.model,
        endpoint=change.endpoint,
        from_state=change.from_state,
        to_state=change.to_state,
        reason=change.reason,
        correlation_id=tid,
    )


def record_correction(w: SessionWriter, step: int, correction: ModelCorrection) -> None:
    """A correction the model got within a model step, as a ModelCorrected event."""
    tid = w.state.turn.turn_id if w.state.turn else ""
    dropped = [{"name": c.name, "arguments": _arguments(c.arguments_json)} for c in correction.dropped]
    w.add(
        ev.ModelCorrected,
        turn_id=tid,
        step=step,
        attempt=correction.attempt,
        kind=str(correction.kind),
        correction=correction.correction,
        model_text=correction.model_text,
        dropped_calls_json=json.dumps(dropped, ensure_ascii=False),
        correlation_id=tid,
    )


def _arguments(arguments_json: str) -> object:
    try:
        return json.loads(arguments_json)
    except json.JSONDecodeError:
        return arguments_json
