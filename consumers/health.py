"""Liveness and readiness of a long-running process (gateway, turn worker, projector).

Alive means the process answers. Ready means it can do its work now: the log answers (on Kafka
the broker, and for an owner its share of the partitions is taken), the event schemas load,
and the projections it serves are within their lag bound. Each check returns None or what is
wrong, in words an operator can act on; the answer holds no session data, so it is served
without a key. SIGTERM marks the process draining first, so an orchestrator stops sending it
work before the drain begins.

The gateway serves ``/healthz`` and ``/readyz`` among its routes; ``serve_health`` serves the
same two routes for a process without the gateway (aiohttp, a core dependency).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import structlog
from aiohttp import web

from turnlog.consumers.log_metrics import CONTENT_TYPE, log_metrics
from turnlog.engine import codec
from turnlog.engine.log.base import EventLog
from turnlog.projections.rebuild import PartitionLag, partition_lag

Check = Callable[[], Awaitable[str | None]]
"""One readiness condition: None when it holds, else what is wrong and what to do."""
CHECK_TIMEOUT_S = 3.0
"""A check that does not answer within this is reported as failing (a broker that is down)."""
MAX_PROJECTION_LAG_S = 30.0
"""Ready while the oldest event the projections have not applied waited at most this long."""

log = structlog.get_logger("turnlog.health")


@dataclass
class Readiness:
    """The checks a process is ready by, and whether it is draining (SIGTERM received)."""

    checks: dict[str, Check] = field(default_factory=dict)
    draining: bool = False
    metrics: Callable[[], str] | None = None
    """The process's metrics in Prometheus' text format, served on ``/metrics`` beside the checks."""

    async def report(self) -> tuple[bool, dict[str, str]]:
        """Whether every check holds, and each check's answer ("ok" or the problem)."""
        if self.draining:
            return False, {"process": "draining: stopping after SIGTERM, takes no new work"}
        names = list(self.checks)
        answers = await asyncio.gather(*(_run(self.checks[n]) for n in names))
        results = {name: answer or "ok" for name, answer in zip(names, answers, strict=True)}
        return all(answer is None for answer in answers), results

    def drain(self) -> None:
        if not self.draining:
            log.info("health.draining")
        self.draining = True


async def _run(check: Check) -> str | None:
    try:
        return await asyncio.wait_for(check(), CHECK_TIMEOUT_S)
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:g} s"
    except Exception as exc:  # a check that fails is a problem to report, not a crash
        return f"{type(exc).__name__}: {exc}"


def log_readiness(event_log: EventLog, **more: Check) -> Readiness:
    """What a process that reads the log is ready by (the log and the schemas, then ``more``),
    with the log's memory metrics (``log_metrics``)."""
    return Readiness(
        {"log": log_check(event_log), "schemas": schemas_check(), **more},
        metrics=lambda: log_metrics(event_log),
    )


def log_check(event_log: EventLog) -> Check:
    """The log answers; on Kafka the broker does, and an owner holds the partitions it was given."""
    return event_log.readiness_problem


def schemas_check() -> Check:
    """The event schemas load (package data: an install without them reads and writes nothing)."""

    async def check() -> str | None:
        return codec.schema_problem()

    return check


def projections_check(
    event_log: EventLog,
    applied: Callable[[], Awaitable[dict[int, int]]] | None = None,
    *,
    lags: Callable[[], Awaitable[dict[int, PartitionLag]]] | None = None,
    max_lag_s: float = MAX_PROJECTION_LAG_S,
) -> Check:
    """The projections are within ``max_lag_s`` of the log: from ``lags`` (a projector in this
    process) or from the offsets ``applied`` reads from the store (a projector elsewhere)."""

    async def current() -> dict[int, PartitionLag]:
        if lags is not None:
            return await lags()
        assert applied is not None
        offsets = await applied()
        return {p: await partition_lag(event_log, p, offsets.get(p, 0)) for p in range(event_log.partitions)}

    async def check() -> str | None:
        behind = {p: lag.behind_ms() for p, lag in (await current()).items()}
        worst = max(behind, key=lambda p: behind[p], default=None)
        if worst is None or behind[worst] <= max_lag_s * 1000:
            return None
        return (
            f"the projections are {behind[worst] / 1000:.0f} s behind the log (partition {worst}; bound "
            f"{max_lag_s:g} s); check that the projector runs and its database keeps up"
        )

    return check


async def health_answer(readiness: Readiness, path: str) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of ``/healthz`` or ``/readyz``."""
    if path == "/healthz":
        return 200, {"status": "alive"}
    ready, checks = await readiness.report()
    return (200 if ready else 503), {"ready": ready, "checks": checks}


async def serve_health(readiness: Readiness, host: str, port: int) -> web.AppRunner:
    """Serve ``/healthz`` and ``/readyz`` on ``host:port`` until the returned runner is cleaned up,
    and ``/metrics`` if the process has metrics."""

    async def answer(request: web.Request) -> web.Response:
        status, body = await health_answer(readiness, request.path)
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")

    app = web.Application()
    app.router.add_get("/healthz", answer)
    app.router.add_get("/readyz", answer)
    if (metrics := readiness.metrics) is not None:

        async def scrape(request: web.Request) -> web.Response:
            return web.Response(body=metrics().encode(), headers={"Content-Type": CONTENT_TYPE})

        app.router.add_get("/metrics", scrape)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("health.serving", host=host, port=port)
    return runner
