"""Long-running processes on the log: the turn worker, the projector, their group runner."""

from .projector import Projector
from .runner import GroupConsumer
from .turn_worker import TurnWorker

__all__ = ["GroupConsumer", "Projector", "TurnWorker"]
