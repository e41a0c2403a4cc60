"""An erasure's step on the read models (engine.erasure): the erased sessions' rows are folded
again from the log, where their content now reads as erased, so the live rows equal what
``turnlog rebuild`` gives; then the store's files are purged (``ProjectionStore.purge_async``).

Refolding rather than blanking columns keeps one rule for what a row holds (projections/apply.py)
and makes rebuild-equals-live hold by construction. The analytics tables hold no content and
are left alone, so the daily totals do not change.
"""

from __future__ import annotations

from typing import Sequence

import structlog

from turnlog.engine.crypto.keystore import ErasureRecord
from turnlog.engine.erasure import Eraser, ErasureStep, MemoryForgetter
from turnlog.engine.erasure.eraser import BATCH
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.log.base import EventLog
from turnlog.engine.session import AgentSessions

from .queries import session_ids_of
from .store import ProjectionStore, SessionsMoved

log = structlog.get_logger("turnlog.erasure")
ATTEMPTS = 10


def open_eraser(
    api: AgentSessions, store: ProjectionStore, *, memory: bool = True, batch: int = BATCH
) -> Eraser | None:
    """The eraser of a deployment: its API's log and cipher, its projections, and the memory
    stores its agents hold (``memory``); None when the log encrypts nothing (nothing to erase)."""
    try:
        cipher = Eraser.cipher_of(api)
    except ConfigurationError:
        return None
    steps: list[ErasureStep] = [ProjectionScrubber(api.log, store)]
    if memory:
        stores = {id(a.memory.store): a.memory.store for a in api.agents if a.memory is not None}
        steps += [MemoryForgetter(s) for s in stores.values()]

    async def projected(user_id: str) -> list[str]:
        return session_ids_of(store, user_id)

    return Eraser(api, cipher, steps, find_sessions=projected, batch=batch)


class ProjectionScrubber:
    """The ``engine.erasure.ErasureStep`` of a deployment's projection store."""

    name = "projections"

    def __init__(self, event_log: EventLog, store: ProjectionStore) -> None:
        self.log = event_log
        self.store = store

    async def erased(self, record: ErasureRecord, session_ids: Sequence[str]) -> None:
        """Refold the sessions' rows. The projector may apply their last events (the erasure)
        meanwhile: the rows are only replaced from events at least as new as the rows, so a
        replacement that finds its sessions moved on reads them again."""
        for attempt in range(1, ATTEMPTS + 1):
            events = {sid: await self.log.read_session(sid) for sid in session_ids}
            try:
                await self.store.replace_sessions(events)
                return
            except SessionsMoved:
                if attempt == ATTEMPTS:
                    raise
                log.info("erasure.projections_moved", erasure=record.erasure_id, attempt=attempt)

    async def finished(self, record: ErasureRecord, resumed: bool) -> None:
        await self.store.purge_async()
