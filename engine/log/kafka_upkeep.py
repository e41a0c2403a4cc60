"""What a Kafka owner does beside sequencing and appending: commit idle consumer groups'
offsets and the session index (``kafka_commits.flush``), and index what other producers wrote to
its partitions, settling the poison among it (``kafka_poison``: dead letters and ERROR markers,
in one transaction)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Sequence

import structlog

from ..errors import LogError
from .kafka_commits import flush, transact
from .kafka_owner import PartitionOwner
from .kafka_poison import settle

log = structlog.get_logger("turnlog.kafka")


async def flush_all(owners: Sequence[PartitionOwner], force: bool = False) -> None:
    """Commit pending group offsets and the session index when due (``force``: now), every
    owned partition in transactions of its own, all partitions at once."""
    await asyncio.gather(*(flush(owner, force) for owner in owners))


async def tail_owned(owners: Sequence[PartitionOwner]) -> None:
    """Index what others wrote to our partitions since we read them, and settle poison."""
    for owner in owners:
        if not owner.owned:
            continue
        async with owner.lock:
            if owner.owned:
                with contextlib.suppress(LogError):
                    await owner.owners.reader.catch_up(owner.index)
                    await settle_poison(owner)


async def settle_poison(owner: PartitionOwner) -> None:
    """Dead-letter the partition's poison and move its sessions to ERROR (kafka_poison); called
    with ``owner.lock`` held."""
    index = owner.index
    await owner.owners.reader.load(
        index, [p.session_id for p in index.poison if p.source not in index.dead_sources]
    )
    markers, dead = settle(index, owner.owners.name)
    if dead:
        await transact(owner, markers, dead=dead)
        log.warning(
            "kafka.poison_dead_lettered", partition=owner.partition, count=len(dead), reason=dead[0].reason
        )
        owner.owners.notify()
