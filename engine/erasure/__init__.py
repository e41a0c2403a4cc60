"""Erasure (crypto-shredding, issue 43): ``Eraser`` erases a session's or a user's content
durably and idempotently, with the deployment's steps (``ErasureStep``: projections, memories)."""

from .eraser import Eraser, ErasureReport, ErasureStep, SessionEraser, erasure_event_id
from .memory import MemoryForgetter

__all__ = ["Eraser", "ErasureReport", "ErasureStep", "MemoryForgetter", "SessionEraser", "erasure_event_id"]
