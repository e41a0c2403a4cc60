"""A circuit breaker per model endpoint: which model a new call starts with (seed §8).

The seed's rule holds per call: a call that fails is never made again on the model it failed
on; the fallback chain (engine.models.fallback) hands it to the backup. Alone, that rule makes
every session learn of an outage by itself: each turn waits out its own first-token limit. The
breaker is what a process learns, shared by every session it runs:

* **closed**: calls go to the endpoint. It opens when, within ``window_s``, at least
  ``failures`` calls failed and they were at least ``failure_rate`` of the calls that ended
  (a busy endpoint's background of errors never opens it), or when the endpoint **stalls**:
  ``stall_calls`` calls have waited for a first token longer than ``stall_factor`` times the
  endpoint's usual time to first token (its 90th percentile, at least ``stall_min_s``) and no
  call got a first token in that time. Waiting for the first-token limit (15 s) to count
  failures would let every call already in flight wait it out: with hundreds of sessions, all
  of them start on a hung endpoint before the first one times out.
* **open**: new calls start on the next model of the chain for ``cooldown_s``. When it opens,
  calls still waiting for their first token on the endpoint are handed to the next model at
  once (as a timeout would, earlier), never sent to this one again.
* **half-open**: the first call after the cool-down is the probe; the others keep going to the
  next model. The probe's answer closes the breaker; its failure (or its own stall) opens it
  for another cool-down.

Each change is attributed to the call that caused it (the one that failed last, the oldest
stalled one, the probe), whose stream carries it as a ``BreakerChange`` for its session's log.
Errors that are the request's own (a context too long, a 4xx other than 408 and 429) and calls
that end without an outcome (cancelled, or timed out while still queued by the client-side
limiter) count for nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

from ..errors import ConfigurationError, ContextLengthError, ModelError
from .clock import Clock, Timer

TTFT_SAMPLES = 64
"""First-token times kept per endpoint for its usual time (a sliding sample)."""
MIN_TTFT_SAMPLES = 10
"""Stalls are detected once this many first tokens have been seen (before that, only the
first-token limit and failures count)."""


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When an endpoint's breaker opens and for how long; ``failures=0`` turns it off."""

    failures: int = 5
    failure_rate: float = 0.5
    window_s: float = 30.0
    cooldown_s: float = 10.0
    stall_calls: int = 5
    stall_factor: float = 4.0
    stall_min_s: float = 1.0

    def __post_init__(self) -> None:
        numbers = (self.window_s, self.cooldown_s, self.stall_factor, self.stall_min_s)
        if self.failures < 0 or self.stall_calls < 1 or min(numbers) <= 0:
            raise ConfigurationError(
                f"breaker settings {self}: failures must be >= 0 (0 turns the breaker off), "
                "stall_calls >= 1, and window_s, cooldown_s, stall_factor, stall_min_s above 0"
            )
        if not 0.0 < self.failure_rate <= 1.0:
            raise ConfigurationError(f"breaker failure_rate must be in (0, 1], not {self.failure_rate}")


@dataclass(frozen=True, slots=True)
class BreakerChange:
    """An endpoint's circuit breaker changed state because of a call: a chunk of that call's
    stream (engine.models.base), recorded as a ModelBreakerChanged event in its session."""

    model: str
    endpoint: str
    from_state: str
    to_state: str
    reason: str


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerOpenError(ModelError):
    """The endpoint's breaker opened while this call waited for its first token: the call goes
    to the next model (it is never sent to this endpoint again)."""


class Attempt:
    """One call's passage through an endpoint: when its request went out, whether a first token
    came, and the breaker changes it is to report."""

    __slots__ = ("breaker", "model", "probe", "movable", "sent_at", "answered", "settled", "reports", "_cut")

    def __init__(self, breaker: Breaker, model: str, *, probe: bool = False, movable: bool = True) -> None:
        self.breaker = breaker
        self.model = model
        self.probe = probe
        self.movable = movable
        """Another model can take the call over (the last of a chain is only counted, never cut)."""
        self.sent_at: float | None = None
        """When the request went out (None while the client-side limiter holds it)."""
        self.answered = False
        self.settled = False
        self.reports: list[BreakerChange] = []
        self._cut: Callable[[ModelError], None] | None = None

    def attach(self, cut: Callable[[ModelError], None]) -> None:
        """How to end the call while it waits for its first token (engine.models.limits)."""
        self._cut = cut

    def cut(self, error: ModelError) -> None:
        self.settled = True
        if self._cut is not None:
            self._cut(error)

    def take_reports(self) -> list[BreakerChange]:
        reports, self.reports = self.reports, []
        return reports


class Breaker:
    """One endpoint's breaker, shared by every call of the process to that endpoint."""

    def __init__(self, url: str, label: str, policy: BreakerPolicy, clock: Clock) -> None:
        self.url = url
        """The endpoint's base URL (what its changes record)."""
        self.label = label
        """The endpoint in words: its model and URL."""
        self.policy = policy
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.opened_at = 0.0
        self.why = ""
        """Why it opened, for the calls it sends elsewhere."""
        self._outcomes: deque[tuple[float, bool]] = deque()
        """(time, failed) of the calls that ended within the window, while closed."""
        self._failed = 0
        self._probe: Attempt | None = None
        self._waiting: dict[Attempt, None] = {}
        """Sent calls without a first token yet, oldest first."""
        self._ttfts: deque[float] = deque(maxlen=TTFT_SAMPLES)
        self._last_answer = clock.now()
        self._timer: Timer | None = None

    # -- which model a call starts with ---------------------------------------------------------

    def admit(self, model: str) -> Attempt | str:
        """An attempt on this endpoint (``sent`` once its request goes out), or why the call
        must start on the next model."""
        if self.policy.failures == 0 or self.state is BreakerState.CLOSED:
            return Attempt(self, model)
        now = self.clock.now()
        if self.state is BreakerState.OPEN and now - self.opened_at < self.policy.cooldown_s:
            return self.skip_reason(now)
        if self._probe is not None:
            return f"the breaker of {self.label} is half-open and a probe call is testing it"
        probe = self._probe = Attempt(self, model, probe=True)
        if self.state is BreakerState.OPEN:
            note = f"the cool-down of {self.policy.cooldown_s:g} s is over; this call probes {self.label}"
            self._move(BreakerState.HALF_OPEN, probe, note)
        return probe

    def track(self, model: str) -> Attempt:
        """An attempt counted but never turned away or handed over: the chain's last model."""
        return Attempt(self, model, movable=False)

    def skip_reason(self, now: float) -> str:
        return (
            f"the breaker of {self.label} is open ({self.why}); it probes the endpoint again "
            f"in {max(0.0, self.opened_at + self.policy.cooldown_s - now):.1f} s"
        )

    # -- a call's progress -----------------------------------------------------------------------

    def sent(self, attempt: Attempt) -> None:
        if attempt.settled or attempt.answered:
            return
        attempt.sent_at = self.clock.now()
        self._waiting[attempt] = None
        self._arm()

    def queued(self, attempt: Attempt) -> None:
        attempt.sent_at = None
        self._waiting.pop(attempt, None)

    def answered(self, attempt: Attempt) -> None:
        attempt.answered = True
        self._waiting.pop(attempt, None)
        now = self._last_answer = self.clock.now()
        if attempt.sent_at is not None:
            self._ttfts.append(now - attempt.sent_at)

    # -- a call's outcome ------------------------------------------------------------------------

    def succeeded(self, attempt: Attempt) -> None:
        if not self._settle(attempt):
            return
        if attempt.probe:
            self._close(attempt)
        elif self.state is BreakerState.CLOSED:
            self._record(failed=False)

    def failed(self, attempt: Attempt, error: BaseException) -> None:
        """A call that failed on this endpoint (a request's own error counts for nothing)."""
        sent = attempt.sent_at is not None or attempt.answered
        if not self._settle(attempt):
            return
        if not sent or not counts_against_endpoint(error):
            self.released(attempt)
            return
        if attempt.probe:
            self._open(attempt, f"the probe call failed ({_short(error)})")
        elif self.state is BreakerState.CLOSED:
            self._record(failed=True)
            if self._tripped():
                calls = len(self._outcomes)
                reason = (
                    f"{self._failed} of the {calls} calls that ended within {self.policy.window_s:g} s "
                    f"failed, the last with {_short(error)}"
                )
                self._open(attempt, reason)

    def released(self, attempt: Attempt) -> None:
        """A call that ended without telling anything about the endpoint."""
        attempt.settled = True
        self._waiting.pop(attempt, None)
        if self._probe is attempt:
            self._probe = None  # the next call probes instead

    def _settle(self, attempt: Attempt) -> bool:
        """Mark the call ended; False if it already was (a call handed over by an opening)."""
        self._waiting.pop(attempt, None)
        if attempt.settled:
            if self._probe is attempt:
                self._probe = None
            return False
        attempt.settled = True
        return True

    def _record(self, *, failed: bool) -> None:
        now = self.clock.now()
        self._outcomes.append((now, failed))
        self._failed += failed
        horizon = now - self.policy.window_s
        while self._outcomes and self._outcomes[0][0] < horizon:
            self._failed -= self._outcomes.popleft()[1]

    def _tripped(self) -> bool:
        policy = self.policy
        return self._failed >= policy.failures and self._failed >= policy.failure_rate * len(self._outcomes)

    # -- state changes ---------------------------------------------------------------------------

    def _open(self, reporter: Attempt, why: str) -> None:
        self.opened_at = self.clock.now()
        self.why = why
        self._probe = None
        note = f"{why}; new calls start on the next model for {self.policy.cooldown_s:g} s"
        self._move(BreakerState.OPEN, reporter, note)
        self._outcomes.clear()
        self._failed = 0
        handed = BreakerOpenError(
            f"the breaker of {self.label} opened while this call waited for its first token ({why})"
        )
        for waiting in [a for a in self._waiting if a.movable]:
            self._waiting.pop(waiting, None)
            waiting.cut(handed)

    def _close(self, reporter: Attempt) -> None:
        self._probe = None
        self.why = ""
        self._move(
            BreakerState.CLOSED, reporter, f"the probe call answered; {self.label} takes new calls again"
        )

    def _move(self, to: BreakerState, reporter: Attempt, reason: str) -> None:
        change = BreakerChange(reporter.model, self.url, str(self.state), str(to), reason)
        self.state = to
        reporter.reports.append(change)

    # -- stalls ----------------------------------------------------------------------------------

    def stall_after_s(self) -> float | None:
        """How long a first token may take before a waiting call counts as stalled; None until
        enough first tokens have been seen to know what is usual."""
        if len(self._ttfts) < MIN_TTFT_SAMPLES:
            return None
        samples = sorted(self._ttfts)
        usual = samples[int(0.9 * (len(samples) - 1))]
        return max(self.policy.stall_min_s, self.policy.stall_factor * usual)

    def _arm(self) -> None:
        """Wake up when the waiting calls could have stalled (one timer per endpoint)."""
        if self._timer is not None or self.policy.failures == 0:
            return
        when = self._stall_check_at()
        if when is not None:
            self._timer = self.clock.call_at(when, self._check_stall)

    def _stall_check_at(self) -> float | None:
        if self.state is BreakerState.HALF_OPEN:
            probe = self._probe
            since = probe.sent_at if probe is not None and probe in self._waiting else None
        elif self.state is BreakerState.CLOSED and len(self._waiting) >= self.policy.stall_calls:
            nth = _first(self._waiting, self.policy.stall_calls)[-1]
            since = None if nth.sent_at is None else max(nth.sent_at, self._last_answer)
        else:
            return None
        limit = self.stall_after_s() if since is not None else None
        return None if since is None or limit is None else since + limit

    def _check_stall(self) -> None:
        """The stall limit passed: decide once the loop has run what is ready. After the process
        itself was busy past the limit, the first tokens that came meanwhile are read in the
        loop's next turn, after this timer: deciding now would blame the endpoint."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._decide_stall()
            return
        self._timer = loop.call_soon(self._decide_stall)

    def _decide_stall(self) -> None:
        self._timer = None
        limit = self.stall_after_s()
        if limit is not None:
            now = self.clock.now()
            stalled = [a for a in self._waiting if a.sent_at is not None and now - a.sent_at >= limit]
            if self.state is BreakerState.HALF_OPEN and self._probe in stalled:
                assert self._probe is not None
                self._open(self._probe, f"the probe call had no first token within {limit:.2g} s")
            elif (
                self.state is BreakerState.CLOSED
                and len(stalled) >= self.policy.stall_calls
                and now - self._last_answer >= limit
            ):
                usual = limit / self.policy.stall_factor
                why = (
                    f"{len(stalled)} calls waited {limit:.2g} s for a first token and none came "
                    f"(usually within {usual:.2g} s)"
                )
                self._open(stalled[0], why)
        self._arm()


def counts_against_endpoint(error: BaseException) -> bool:
    """Whether a failure says the endpoint is unwell: not a context too long, nor a refusal of
    the request itself (4xx other than 408 and 429)."""
    if isinstance(error, ContextLengthError):
        return False
    status = getattr(error, "status", None)
    return not (isinstance(status, int) and 400 <= status < 500 and status not in (408, 429))


def _first(waiting: dict[Attempt, None], n: int) -> list[Attempt]:
    out = []
    for attempt in waiting:
        out.append(attempt)
        if len(out) == n:
            break
    return out


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 200 else text[:200] + "..."
