"""The ends of a Kafka log's partitions, asked for together (``PartitionReader.end``).

A process that owns no partition (a gateway, the projector) asks the broker for a partition's
end before every read of it, so the read has everything committed before it began: a POST's
access check, each stream's catch-up and each follower's pass (which asks for all partitions at
once first: ``KafkaEventLog.partitions_to_read``). At a few hundred sessions those
are several ListOffsets requests a turn, each a request the broker answers and this process
encodes, sends and decodes (bench/README.md section 12). Asked for together, they are one: a
caller's partition joins the next request, which is sent once the request in flight (if any) is
answered, for every partition named meanwhile. A request sent after the call began still gives
what was committed before it, so no reader sees less than it did asking alone; it may wait for
the request in flight to come back first.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

Ask = Callable[[frozenset[int]], Awaitable[dict[int, int]]]
"""Asks the broker for the ends of some partitions (one request)."""


class SharedEnds:
    """Partition ends for many callers, one request at a time for all they named."""

    def __init__(self, ask: Ask) -> None:
        self._ask = ask
        self._wanted: set[int] = set()
        self._next: asyncio.Future[dict[int, int]] | None = None
        """What the callers waiting for the next request get."""
        self._asking: asyncio.Task[None] | None = None

    async def end(self, partition: int) -> int:
        """The partition's end, from a request sent after this call began."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._next.add_done_callback(_retrieved)
        answer = self._next
        self._wanted.add(partition)
        if self._asking is None:
            self._asking = asyncio.get_running_loop().create_task(self._ask_while_wanted())
        return (await asyncio.shield(answer))[partition]  # one caller cancelled leaves the rest

    async def _ask_while_wanted(self) -> None:
        """Send the next request while callers wait for one; each is answered (or failed) whole."""
        try:
            while (answer := self._next) is not None:
                wanted, self._wanted, self._next = frozenset(self._wanted), set(), None
                try:
                    answer.set_result(await self._ask(wanted))
                except asyncio.CancelledError:
                    answer.cancel()
                    raise
                except Exception as exc:  # each caller raises it
                    answer.set_exception(exc)
        finally:
            self._asking = None


def _retrieved(answer: asyncio.Future[dict[int, int]]) -> None:
    """Mark a failed answer's error as seen: every caller may have been cancelled before it."""
    if not answer.cancelled():
        answer.exception()
