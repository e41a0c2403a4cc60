"""What the HTTP routes use of the gateway process: the ``GatewayParts`` protocol.

The routes (routes.py and the modules it builds on) are built by the process (service.py's
``Gateway``, which satisfies this) and answer from its parts; naming them here, instead of
importing the class, keeps the routes below the process in the import graph and says what a
route may reach.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, Protocol

from turnlog.consumers.analytics import AnalyticsConsumer
from turnlog.consumers.health import Readiness
from turnlog.engine.erasure import Eraser
from turnlog.engine.log.base import EventLog
from turnlog.engine.session import AgentSessions
from turnlog.projections.store import ProjectionStore

from .config import GatewayConfig
from .http import Guard
from .hub import LiveHub
from .limits import Limits, StreamCounter
from .observe import GatewayMetrics


class GatewayParts(Protocol):
    """The engine API and log, the projections, live fan-out, limits and health of one gateway."""

    config: GatewayConfig
    limits: Limits
    log: EventLog
    store: ProjectionStore
    api: AgentSessions
    hub: LiveHub
    guard: Guard
    streams: StreamCounter
    analytics: AnalyticsConsumer
    metrics: GatewayMetrics
    readiness: Readiness
    eraser: Eraser | None
    """Erases users' and sessions' content; None when the log encrypts nothing."""

    async def projection(self, session_id: str, version: int) -> dict[str, object] | None:
        """The session's projection row, at ``version`` or later if the projector gets there."""
        ...

    async def catch_up_projections(self) -> None: ...

    async def catch_up_analytics(self) -> None: ...

    def background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` until it ends or the gateway stops (an experiment)."""
        ...
