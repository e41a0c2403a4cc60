"""Per-user limits: a token-bucket request rate and a cap on open event streams."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 64 * 1024
    """Largest request body accepted, bytes (413 above it)."""
    requests_per_second: float = 20.0
    """Sustained request rate per user (429 above it)."""
    burst: int = 40
    """Requests a user may make at once before the rate applies."""
    streams_per_user: int = 8
    """Event streams one user may hold open at once (429 above it)."""


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
    """Open streams per user."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def try_open(self, user: str) -> bool:
        count = self._open.get(user, 0)
        if count >= self.limit:
            return False
        self._open[user] = count + 1
        return True

    def close(self, user: str) -> None:
        count = self._open.get(user, 0) - 1
        if count > 0:
            self._open[user] = count
        else:
            self._open.pop(user, None)

    def open_count(self, user: str) -> int:
        return self._open.get(user, 0)
