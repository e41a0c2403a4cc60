"""Event log backends behind one interface."""

from .base import EventLog, LogRecord, murmur2, partition_for
from .kafka import KafkaEventLog
from .sqlite import SqliteEventLog

__all__ = ["EventLog", "KafkaEventLog", "LogRecord", "SqliteEventLog", "murmur2", "partition_for"]
