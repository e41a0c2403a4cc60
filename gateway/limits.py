"""The gateway's limits: request size, parse bounds, read timeouts, a token-bucket request rate per
user and a cap on open event streams per user."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Limits:
    """The bounds the gateway holds every request to (sizes, rates, streams, deadlines)."""

    max_message_bytes: int = 64 * 1024
    """Largest request body accepted, bytes (413 above it)."""
    requests_per_second: float = 20.0
    """Sustained request rate per user (429 above it)."""
    burst: int = 40
    """Requests a user may make at once before the rate applies."""
    streams_per_user: int = 8
    """Event streams one user may hold open at once (429 above it)."""
    max_json_depth: int = 32
    """Deepest nesting of arrays and objects in a JSON body (400 above it)."""
    max_number_chars: int = 40
    """Longest number literal in a JSON body, in characters (400 above it)."""
    max_header_bytes: int = 16 * 1024
    """Largest request line plus headers (431 above it)."""
    header_timeout_s: float = 10.0
    """Time a connection has to send a whole request line and headers, from when it opens or its
    previous answer ends; past it, 408 (or a silent close if nothing was sent)."""
    body_timeout_s: float = 30.0
    """Time a request has to send its whole body once its headers are in; past it, 408 and close."""
    keep_alive_s: int = 5
    """Idle time after an answer before a keep-alive connection is closed."""


class RateLimiter:
    """One token bucket per user."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, user: str) -> float:
        """Spend a token; return 0.0, or the seconds to wait if the bucket is empty."""
        now = time.monotonic()
        tokens, at = self._buckets.get(user, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[user] = (tokens, now)
            return (1.0 - tokens) / self.rate if self.rate > 0 else 3600.0
        self._buckets[user] = (tokens - 1.0, now)
        return 0.0


class StreamCounter:
    """Open streams per user. A slot is taken with ``take`` and given back by the release it
    returns (once, however often it is called), so an answer that owns it can release it on
    every path (gateway.lifetimes)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def try_open(self, user: str) -> bool:
        count = self._open.get(user, 0)
        if count >= self.limit:
            return False
        self._open[user] = count + 1
        return True

    def take(self, user: str) -> Callable[[], None] | None:
        """A slot for ``user`` and the function that gives it back, or None if they have none left."""
        if not self.try_open(user):
            return None
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.close(user)

        return release

    def close(self, user: str) -> None:
        count = self._open.get(user, 0) - 1
        if count > 0:
            self._open[user] = count
        else:
            self._open.pop(user, None)

    def open_count(self, user: str) -> int:
        return self._open.get(user, 0)
