"""One model call of a turn: the model's stream turned into what the caller sees (answer text as
it streams, progress while nothing visible streams) and what the log records along the way (a
fallback to another model, a correction the model got).

Answer text goes out as ``ModelDelta`` and never enters the log; ``ModelProgress`` says, about once
a second, how many chunks the model has produced so far (on llama.cpp one chunk is one token), also
while it writes a tool call, which streams no text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import AsyncIterator

from . import events as ev
from .agent import Agent
from .errors import ModelError
from .models.base import ModelCorrection, ModelRequest, ModelResponse, ModelSwitch, TextDelta
from .models.limits import stream_within
from .stream import ModelDelta, ModelProgress, StreamItem
from .writer import SessionWriter

PROGRESS_EVERY_S = 1.0


@dataclass(slots=True)
class CallOutcome:
    """What one model call came to: its answer or its error, and how long it took."""

    response: ModelResponse | None = None
    error: Exception | None = None
    switches: int = 0
    """Fallbacks to another model during the call."""
    latency_ms: float = 0.0


async def stream_call(
    w: SessionWriter, agent: Agent, request: ModelRequest, step: int, outcome: CallOutcome
) -> AsyncIterator[StreamItem]:
    """Call the model within the agent's time limits; fill ``outcome``; never raise a model failure."""
    session_id = w.state.session_id
    turn_id = w.state.turn.turn_id if w.state.turn else ""
    started = last_progress = time.perf_counter()
    chunks = 0
    try:
        stream = stream_within(agent.model, request, agent.first_token_timeout_s, agent.model_timeout_s)
        async for chunk in stream:
            if isinstance(chunk, TextDelta):
                chunks += 1
                if chunk.text:  # an empty delta only says the model is producing something
                    yield ModelDelta(session_id, turn_id, step, chunk.text)
                now = time.perf_counter()
                if now - last_progress >= PROGRESS_EVERY_S:
                    last_progress = now
                    yield ModelProgress(session_id, turn_id, step, chunks, round(now - started, 1))
            elif isinstance(chunk, ModelSwitch):
                outcome.switches += 1
                record_switch(w, step, chunk)
            elif isinstance(chunk, ModelCorrection):
                record_correction(w, step, chunk)
            else:
                outcome.response = chunk
        if outcome.response is None:
            raise ModelError(f"{agent.model.name} ended its stream without a complete message")
    except Exception as exc:  # any model failure is recorded, never a crashed worker
        outcome.error = exc
    outcome.latency_ms = round((time.perf_counter() - started) * 1000, 3)


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
