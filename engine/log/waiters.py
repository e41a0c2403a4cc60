"""Waits for something a log hears of, woken together: its next append
(``EventLog.wait_for_append``), or, on Kafka, the next record heard of a session
(``kafka_heard.SessionWaiters``).

Consumers wait in a loop with a timeout (a follower every 0.2-1 s), and a process may append
nothing for hours: a Kafka gateway never appends (its messages go through the inbox), and an
idle embedded service appends nothing until a user comes. So a wait that times out takes itself
out; only the waits still open are woken.
"""

from __future__ import annotations

import asyncio
import contextlib


class Waiters:
    """The waits open for the next ``wake``."""

    def __init__(self) -> None:
        self._waiting: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return len(self._waiting)

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
        """Answer every wait still open (one may be timing out at this moment)."""
        waiting, self._waiting = self._waiting, set()
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)
