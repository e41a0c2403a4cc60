"""What a caller streaming a turn receives: every event as it is committed to the log, plus
ephemeral model text deltas that never enter the log or the fold (seed §5.2)."""

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


StreamItem = Event | ModelDelta
