"""Shared fixtures."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.log.sqlite import SqliteEventLog

# --- engine: a real SQLite log in tmp_path (tests/test_log_sqlite, test_turn_loop, test_recovery) ---


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


@pytest.fixture
async def log(log_path: Path) -> AsyncIterator[SqliteEventLog]:
    opened = SqliteEventLog(log_path, partitions=4)
    try:
        yield opened
    finally:
        await opened.close()
