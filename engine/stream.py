"""What a caller streaming a turn receives: every event as it is committed to the log, plus
ephemeral model text deltas, progress notes and waits that never enter the log or the fold
(seed §5.2)."""

from __future__ import annotations

from dataclasses import dataclass

from .events import Event


@dataclass(frozen=True, slots=True)
class ModelDelta:
    """A fragment of answer text as the model streams it; the complete text follows as an
    AssistantMessage event once the model call finishes."""

    session_id: str
    turn_id: str
    step: int
    text: str


@dataclass(frozen=True, slots=True)
class ModelProgress:
    """How far a model step has got, about once a second while the model produces output: also
    while it writes a tool call, which streams no text. Ephemeral, like ModelDelta."""

    session_id: str
    turn_id: str
    step: int
    chunks: int
    """Chunks the model has streamed so far in this step (on llama.cpp, one token each)."""
    elapsed_s: float
    """Seconds since the call started."""


@dataclass(frozen=True, slots=True)
class ModelWaiting:
    """A model call waits for its endpoint before its request goes out (the client-side limits,
    a 429's reset), and again when the wait is over (``waiting`` false). The wait counts against
    the call's first-token limit. Ephemeral, like ModelDelta."""

    session_id: str
    turn_id: str
    step: int
    model: str
    reason: str
    """Why, in words for the user: what holds the call."""
    ahead: int = 0
    """Calls of this process queued for the endpoint before this one."""
    waiting: bool = True


StreamItem = Event | ModelDelta | ModelProgress | ModelWaiting
"""What a turn streams to its caller: each event as it is committed, and between them the
model's text as it arrives (``ModelDelta``), its progress (``ModelProgress``) and its waits for
the endpoint's client-side limits (``ModelWaiting``)."""


@dataclass(frozen=True, slots=True)
class Committed:
    """An event committed at ``version`` of a session, known by its number only: a notice that
    tells a listener in another process to read the log (engine.log.kafka_live, local_live)."""

    session_id: str
    version: int
    type: str


LiveItem = StreamItem | Committed
"""What a process hears of the turns other processes run: their stream items, or notices."""
