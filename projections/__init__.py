"""Read models folded from the log, their SQL stores, and rebuild."""

from .rebuild import rebuild
from .store import ProjectionStore, SqliteProjectionStore

__all__ = ["ProjectionStore", "SqliteProjectionStore", "rebuild"]
