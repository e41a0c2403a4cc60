"""Read models folded from the log, their SQL stores, and rebuild."""

from .postgres import PostgresProjectionStore
from .rebuild import rebuild
from .store import ProjectionStore, SqliteProjectionStore

__all__ = ["PostgresProjectionStore", "ProjectionStore", "SqliteProjectionStore", "rebuild"]
