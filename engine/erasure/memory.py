"""An erasure's step on long-term memory: the user's memories (or the erased sessions') leave the
store, and the store is compacted so they leave its files too (engine.memory.edge, .qdrant).

A store another process holds (an embedded folder is one process's at a time) is cleaned by
that process's memory consumer when it reads the erasure event (consumers/memory.py)."""

from __future__ import annotations

from typing import Awaitable, Sequence, TypeVar

import structlog

from ..crypto.keystore import ErasureRecord
from ..errors import MemoryStoreError
from ..memory.base import MemoryStore

T = TypeVar("T")

log = structlog.get_logger("turnlog.erasure")


class MemoryForgetter:
    """The ``ErasureStep`` of one memory store."""

    name = "memories"

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self._deleted: dict[str, int] = {}

    async def erased(self, record: ErasureRecord, session_ids: Sequence[str]) -> None:
        if record.scope == "session":
            deleted = await self._held(self.store.forget(sessions=session_ids), record)
            self._deleted[record.erasure_id] = self._deleted.get(record.erasure_id, 0) + (deleted or 0)

    async def finished(self, record: ErasureRecord, resumed: bool) -> None:
        """Delete a user's memories (all of them, whichever session they came from), and compact
        the store if anything was deleted; a request resumed after a crash compacts anyway (its
        deletion may have happened before the crash, its compaction not)."""
        deleted = self._deleted.pop(record.erasure_id, 0)
        if record.scope == "user":
            deleted += await self._held(self.store.forget(record.subject), record) or 0
        if deleted or resumed:
            await self._held(self.store.compact(), record)
        log.info("erasure.memories", erasure=record.erasure_id, deleted=deleted)

    async def _held(self, call: Awaitable[T], record: ErasureRecord) -> T | None:
        """``call``, or None when another process holds the store (an embedded folder): that
        process's memory consumer erases the memories when it reads the erasure events."""
        try:
            return await call
        except MemoryStoreError as exc:
            log.warning("erasure.memories_elsewhere", erasure=record.erasure_id, error=str(exc))
            return None
