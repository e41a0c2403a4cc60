"""The time a breaker and a limiter read and wait on, replaceable in tests.

Breakers count failures within a window and wait out cool-downs; limiters space requests and
honour a provider's reset. Both read ``now()`` and schedule wake-ups with ``call_at``, never
``time`` or the loop directly, so a test can drive them with a ``ManualClock`` (advanced by
hand) instead of sleeping, and assert what happened without reading a wall clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Callable, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock:
    """Monotonic seconds, and callbacks on the running loop at a time on that scale."""

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - self.now()), callback)


class ManualClock(Clock):
    """A clock that moves only when ``advance`` is called; due callbacks run then, in order."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._due: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer(callback)
        heapq.heappush(self._due, (when, next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` and run every callback that is due by then."""
        self._now += seconds
        while self._due and self._due[0][0] <= self._now:
            _, _, timer = heapq.heappop(self._due)
            if not timer.cancelled:
                timer.callback()


class _ManualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


SYSTEM_CLOCK = Clock()
