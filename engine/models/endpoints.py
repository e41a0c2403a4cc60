"""Where a model's calls go, and the state every call to the same place shares in a process.

An endpoint is a base URL and the provider's model name there: what a provider rate-limits and
what goes down. ``Endpoints`` is a process's registry of them: one circuit breaker
(engine.models.breaker) and one client-side limiter (engine.models.ratelimit) per endpoint,
shared by every session the process runs. It is an object, not state hidden in a module: the
turn runner that owns it hands it to the models on every request (``ModelRequest.endpoints``),
so agents that users build get it through the model classes they already use, and two runners
share it only when given the same one (a gateway gives its API and its worker one). A model
called without one keeps a registry of its own.

The settings live beside the model (``OpenAICompatibleModel(limits=..., breaker=...)``, the
routing file); the registry keeps one state per endpoint and takes the newest settings a model
brings for it, so a reloaded routing file changes the limits of the running process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from .breaker import Breaker, BreakerPolicy
from .clock import SYSTEM_CLOCK, Clock
from .ratelimit import EndpointLimits, Limiter


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    """The base URL calls go to."""
    model: str
    """The provider's model name at that URL."""
    limits: EndpointLimits = field(default_factory=EndpointLimits, compare=False)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy, compare=False)
    connections: int | None = field(default=None, compare=False)
    """The calling client's connection pool (engine.models.connections); None: not bounded here."""

    def __str__(self) -> str:
        return f"{self.model} at {self.url}"


class Endpoints:
    """A process's breakers and limiters, one of each per endpoint (url + model)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._breakers: dict[Endpoint, Breaker] = {}
        self._limiters: dict[Endpoint, Limiter] = {}

    def breaker(self, endpoint: Endpoint) -> Breaker:
        breaker = self._breakers.get(endpoint)
        if breaker is None:
            breaker = Breaker(endpoint.url, str(endpoint), endpoint.breaker, self.clock)
            self._breakers[endpoint] = breaker
        elif breaker.policy != endpoint.breaker:
            breaker.policy = endpoint.breaker
        return breaker

    def limiter(self, endpoint: Endpoint) -> Limiter:
        limiter = self._limiters.get(endpoint)
        if limiter is None:
            limiter = self._limiters[endpoint] = Limiter(endpoint.limits, self.clock, endpoint.connections)
        else:
            if limiter.limits != endpoint.limits:
                limiter.limits = endpoint.limits
            limiter.connections = endpoint.connections
        return limiter

    def breakers(self) -> Iterator[Breaker]:
        return iter(list(self._breakers.values()))


__all__ = ["BreakerPolicy", "Endpoint", "EndpointLimits", "Endpoints"]
