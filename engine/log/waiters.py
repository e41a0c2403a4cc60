"""Who waits for a log's next append (``EventLog.wait_for_append``), shared by the backends.

Consumers wait in a loop with a timeout (a follower every 0.2-1 s), and a process may append
nothing for hours: a Kafka gateway never appends (its messages go through the inbox), and an
idle embedded service appends nothing until a user comes. So a wait that times out takes itself
out; only the waits still open are woken by the next append.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Iterable


class AppendWaiters:
    """The waits open for the next append, all woken by ``wake``."""

    def __init__(self) -> None:
        self._waiting: set[asyncio.Future[None]] = set()

    async def wait(self, timeout: float) -> None:
        """Return at the next ``wake``, or after ``timeout`` seconds."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiting.discard(waiter)

    def wake(self) -> None:
        waiting, self._waiting = self._waiting, set()
        wake(waiting)


def wake(waiters: Iterable[asyncio.Future[None]]) -> None:
    """Answer the waiters still waiting (one may have timed out)."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
