"""Event log backends behind one interface."""

from .base import EventLog, LogRecord, murmur2, partition_for
from .sqlite import SqliteEventLog

__all__ = ["EventLog", "LogRecord", "SqliteEventLog", "murmur2", "partition_for"]
