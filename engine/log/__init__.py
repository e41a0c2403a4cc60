"""Event log backends behind one interface."""

from .base import EventLog, LogRecord, SessionSummary, murmur2, partition_for
from .kafka import KafkaEventLog
from .memory import MemoryEventLog
from .sqlite import SqliteEventLog

__all__ = [
    "EventLog",
    "KafkaEventLog",
    "LogRecord",
    "MemoryEventLog",
    "SessionSummary",
    "SqliteEventLog",
    "murmur2",
    "partition_for",
]
