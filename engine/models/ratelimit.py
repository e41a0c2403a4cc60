"""Client-side limits per model endpoint: calls in flight, requests and tokens per minute, and
the client's connections (a call waits for a free one here, where its stream shows the wait).

A worker running hundreds of sessions provokes the 429s it then fails over on, unless it keeps
within what the provider allows. The limiter admits a call's request when every limit allows
it; until then the call waits in a fair queue (each session's calls in order, sessions served
in turn, so one busy session cannot starve the others), and the wait counts against the call's
first-token limit like any other. Providers count requests per minute but enforce them in
shorter slices (OpenAI: "60,000 requests/minute may be enforced as 1,000 requests/second"), so
a request rate is kept both per minute and per second: requests go out evenly spaced,
``ceil(rpm / 60)`` a second, never in bursts (a burst admitted at once reaches the provider
spread over the client's own scheduling, and the next burst, a second later, lands inside the
same provider window), with every interval a little longer than nominal (``WINDOW_MARGIN``) so
that jitter on the way does not bring two requests closer than the provider counts. Tokens per
minute count the request's estimated input (and its answer cap), corrected by the usage the
answer reports.

A 429's ``retry-after-ms`` / ``retry-after`` / ``x-ratelimit-reset-*`` headers ``hold`` the
endpoint: no call is admitted before the reset, so the next calls wait instead of failing. The
limiter is there even with no limits configured, for those holds.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import re
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Mapping

from ..errors import ConfigurationError
from .clock import Clock, Timer

DEFAULT_RETRY_WAIT_S = 10.0
WINDOW_MARGIN = 1.02
"""Each window is kept 2 % longer than its nominal length (see the module's docstring)."""


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    """What a process may send one endpoint; None: no limit of that kind."""

    max_in_flight: int | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: int | None = None
    max_retry_wait_s: float = DEFAULT_RETRY_WAIT_S
    """The longest reset a 429 may make calls wait for; with a longer one they fail over at once."""

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigurationError(
                    f"endpoint limit {name} must be above 0 (or None for no limit), not {value}"
                )
        if self.max_retry_wait_s < 0:
            raise ConfigurationError(
                f"endpoint limit max_retry_wait_s must be >= 0, not {self.max_retry_wait_s}"
            )


class Ticket:
    """An admitted call: released once with the tokens it really used."""

    __slots__ = ("tokens", "released")

    def __init__(self, tokens: list[float]) -> None:
        self.tokens = tokens
        """[admission time, tokens counted] in the limiter's token window."""
        self.released = False


class _Waiter:
    __slots__ = ("key", "tokens", "future")

    def __init__(self, key: str, tokens: int, future: asyncio.Future[Ticket]) -> None:
        self.key, self.tokens, self.future = key, tokens, future


class Limiter:
    """One endpoint's limits and queue, shared by every call of the process to it."""

    def __init__(self, limits: EndpointLimits, clock: Clock, connections: int | None = None) -> None:
        self.limits = limits
        self.clock = clock
        self.connections = connections
        """The model client's connection pool (engine.models.connections): a call streams on a
        connection of its own, so no more calls go out at once than it holds."""
        self.in_flight = 0
        self.held_until = 0.0
        self.hold_reason = ""
        self._sent: deque[float] = deque()
        """Admission times of the last minute (kept only with a request rate)."""
        self._tokens: deque[list[float]] = deque()
        self._token_sum = 0.0
        self._queue: OrderedDict[str, deque[_Waiter]] = OrderedDict()
        self._queued = 0
        self._timer: Timer | None = None
        self._timer_at = 0.0

    @property
    def queued(self) -> int:
        return self._queued

    def admit_now(self, key: str, tokens: int) -> Ticket | None:
        """A ticket at once if nobody waits and every limit allows it; else None."""
        if self._queued or self._blocked(tokens, self.clock.now()) is not None:
            return None
        return self._admit(tokens)

    async def admit(self, key: str, tokens: int) -> Ticket:
        """Wait in the fair queue for a ticket (cancelling the wait leaves the queue)."""
        waiter = _Waiter(key, tokens, asyncio.get_running_loop().create_future())
        self._queue.setdefault(key, deque()).append(waiter)
        self._queued += 1
        self._pump()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._forget(waiter)
            raise

    def release(self, ticket: Ticket, used_tokens: int | None = None) -> None:
        """The call is over; ``used_tokens`` (its usage) replaces the estimate it was admitted on."""
        if ticket.released:
            return
        ticket.released = True
        self.in_flight -= 1
        if used_tokens is not None and self.limits.tokens_per_minute is not None:
            self._token_sum += used_tokens - ticket.tokens[1]
            ticket.tokens[1] = used_tokens
        self._pump()

    def hold(self, seconds: float, reason: str) -> None:
        """Admit nothing for ``seconds`` (a 429's reset)."""
        until = self.clock.now() + seconds
        if until > self.held_until:
            self.held_until, self.hold_reason = until, reason

    def waiting_for(self, tokens: int = 0) -> str:
        """Why a call would wait now, in words for the user's stream."""
        now = self.clock.now()
        if self.held_until > now:
            return f"{self.hold_reason}; waiting {self.held_until - now:.1f} s as it asked"
        limits = self.limits
        if limits.max_in_flight is not None and self.in_flight >= limits.max_in_flight:
            return f"{self.in_flight} calls are in flight to the endpoint, its client-side maximum"
        if self.connections is not None and self.in_flight >= self.connections:
            return f"all {self.connections} connections to the endpoint are in use; waiting for one"
        if self._queued:
            return f"{self._queued} calls wait for the endpoint's client-side limits"
        return "the endpoint's client-side request or token rate is used up for now"

    # -- admission -------------------------------------------------------------------------------

    def _admit(self, tokens: int) -> Ticket:
        now = self.clock.now()
        self.in_flight += 1
        if self.limits.requests_per_minute is not None:
            self._sent.append(now)
        entry = [now, float(tokens)]
        if self.limits.tokens_per_minute is not None:
            self._tokens.append(entry)
            self._token_sum += tokens
        return Ticket(entry)

    def _blocked(self, tokens: int, now: float) -> float | None:
        """None if a call of ``tokens`` may go now; else when to look again (inf: at a release)."""
        limits = self.limits
        if limits.max_in_flight is not None and self.in_flight >= limits.max_in_flight:
            return math.inf
        if self.connections is not None and self.in_flight >= self.connections:
            return math.inf
        until = self.held_until
        if limits.requests_per_minute is not None:
            until = max(until, self._request_slot(limits.requests_per_minute, now))
        if limits.tokens_per_minute is not None:
            until = max(until, self._token_slot(limits.tokens_per_minute, tokens, now))
        return until if until > now else None

    def _request_slot(self, per_minute: float, now: float) -> float:
        sent = self._sent
        while sent and sent[0] <= now - 60.0 * WINDOW_MARGIN:
            sent.popleft()
        per_second = max(1, math.ceil(per_minute / 60.0))
        per_window = max(1, math.floor(per_minute))
        until = sent[-1] + WINDOW_MARGIN / per_second if sent else 0.0
        if len(sent) >= per_window:
            until = max(until, sent[-per_window] + 60.0 * WINDOW_MARGIN)
        return until

    def _token_slot(self, per_minute: int, tokens: int, now: float) -> float:
        window = self._tokens
        while window and window[0][0] <= now - 60.0 * WINDOW_MARGIN:
            self._token_sum -= window.popleft()[1]
        if not window or self._token_sum + tokens <= per_minute:
            return 0.0  # an empty window admits even a request larger than the limit
        freed = self._token_sum
        for at, counted in window:
            freed -= counted
            if freed + tokens <= per_minute:
                return at + 60.0 * WINDOW_MARGIN
        return window[-1][0] + 60.0 * WINDOW_MARGIN

    def _pump(self) -> None:
        """Admit queued calls while the limits allow, sessions in turn."""
        while self._queue:
            key, waiters = next(iter(self._queue.items()))
            waiter = waiters[0]
            if not waiter.future.cancelled():  # a call that gave up leaves without its turn
                blocked = self._blocked(waiter.tokens, self.clock.now())
                if blocked is not None:
                    self._wake_at(blocked)
                    return
            waiters.popleft()
            self._queued -= 1
            if waiters:
                self._queue.move_to_end(key)  # the session's next call waits for the others' turn
            else:
                del self._queue[key]
            if not waiter.future.cancelled():
                waiter.future.set_result(self._admit(waiter.tokens))

    def _wake_at(self, when: float) -> None:
        if when == math.inf or (self._timer is not None and self._timer_at == when):
            return  # a release pumps; or the timer is set already
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self.clock.call_at(when, self._on_timer), when

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    def _forget(self, waiter: _Waiter) -> None:
        """A waiter whose call gave up (its time limit, a cancel)."""
        future = waiter.future
        if future.done() and not future.cancelled():
            self.release(future.result())  # admitted as it gave up: the slot goes back
            return
        waiters = self._queue.get(waiter.key)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            self._queued -= 1
            if not waiters:
                del self._queue[waiter.key]
        self._pump()


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def reset_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a rate-limited client should wait, from a 429's headers: ``retry-after-ms``,
    ``retry-after`` (seconds or an HTTP date), else the ``x-ratelimit-reset-*`` of the limit that
    is used up (OpenAI's durations: ``1s``, ``6m0s``, ``20ms``). None when none says."""
    get = {k.lower(): v for k, v in headers.items()}.get
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = get(name)
        if value:
            seconds = _number(value)
            if seconds is None and name == "retry-after":
                seconds = _http_date_delay(value)
            if seconds is not None:
                return max(0.0, seconds * scale)
    resets = []
    for kind in ("requests", "tokens"):
        reset = get(f"x-ratelimit-reset-{kind}")
        remaining = get(f"x-ratelimit-remaining-{kind}")
        if reset and (remaining is None or _number(remaining) == 0):
            resets.append(_duration(reset))
    found = [r for r in resets if r is not None]
    return max(found) if found else None


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _duration(text: str) -> float | None:
    plain = _number(text)
    if plain is not None:
        return plain
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _http_date_delay(text: str) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()
