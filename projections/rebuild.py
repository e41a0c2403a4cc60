"""Drop the read models and refold them from offset 0 of every partition."""

from __future__ import annotations

from typing import Callable

from engine.log.base import EventLog

from .store import ProjectionStore

BATCH = 1000


async def catch_up(
    log: EventLog,
    store: ProjectionStore,
    *,
    batch: int = BATCH,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Apply everything the log has beyond the store's offsets; return events applied."""
    total = 0
    for partition in range(log.partitions):
        while True:
            records = await log.read_partition(partition, store.next_offset(partition), batch)
            if not records:
                break
            total += store.apply(records)
            if progress is not None:
                progress(len(records))
    return total


async def rebuild(
    log: EventLog, store: ProjectionStore, *, progress: Callable[[int], None] | None = None
) -> int:
    """Reset the store and replay the whole log into it; return events applied."""
    store.reset()
    return await catch_up(log, store, progress=progress)
