"""Prometheus metrics derived from the event stream (seed §7.4).

Counters and histograms are fed by the observability consumer (log events) and by the live hub
(time to first token and calls waiting for an endpoint's client-side limits, which only the live
stream shows). Gauges that describe "now" (sessions by state, consumer lag) are read from the
projections and the log when /metrics is scraped; a breaker's state is the last change any
worker recorded on the log (``ModelBreakerChanged``, labelled by the worker that wrote it), so
one gateway sees every worker's breakers.
"""

from __future__ import annotations

import json
import time
from typing import Awaitable, Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from turnlog.engine import events as ev
from turnlog.engine.stream import ModelDelta, ModelWaiting, StreamItem

LagSource = Callable[[], Awaitable[dict[tuple[str, int], int]]]
StateSource = Callable[[], dict[str, int]]

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)


class GatewayMetrics:
    """The gateway's Prometheus metrics, in a registry of their own, and what feeds them."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._tool_and_turn_metrics(self.registry)
        self._model_metrics(self.registry)
        self._outage_metrics(self.registry)
        self._context_and_state_metrics(self.registry)
        self._first_token_wait: dict[tuple[str, str, int], tuple[float, str]] = {}
        self._session_models: dict[str, str] = {}
        self._session_tool_calls: dict[str, int] = {}
        self._turn_tool_calls: dict[str, int] = {}
        self.lag_source: LagSource | None = None
        self.state_source: StateSource | None = None
        self.text_source: Callable[[], str] | None = None
        """Metrics another part renders itself, in the text format (``consumers.log_metrics``)."""

    def _tool_and_turn_metrics(self, r: CollectorRegistry) -> None:
        self.tool_calls = Counter(
            "turnlog_tool_calls",
            "Finished tool calls by tool and status (success rate = success/all).",
            ["tool", "status"],
            registry=r,
        )
        self.tool_calls_per_session = Histogram(
            "turnlog_tool_calls_per_session",
            "Tool calls a session made, observed when it closes.",
            buckets=COUNT_BUCKETS,
            registry=r,
        )
        self.tool_calls_per_turn = Histogram(
            "turnlog_tool_calls_per_turn", "Tool calls per finished turn.", buckets=COUNT_BUCKETS, registry=r
        )
        self.turns = Counter("turnlog_turns", "Finished turns by outcome.", ["reason"], registry=r)

    def _model_metrics(self, r: CollectorRegistry) -> None:
        self.ttft = Histogram(
            "turnlog_time_to_first_token_seconds",
            "Model call start to its first text token.",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.model_calls = Counter(
            "turnlog_model_calls", "Model calls by model and status.", ["model", "status"], registry=r
        )
        self.model_errors = Counter(
            "turnlog_model_errors", "Failed model calls by model.", ["model"], registry=r
        )
        self.model_fallbacks = Counter(
            "turnlog_model_fallbacks",
            "Model calls answered by another model than the session's.",
            ["model"],
            registry=r,
        )

    def _outage_metrics(self, r: CollectorRegistry) -> None:
        self.model_switches = Counter(
            "turnlog_model_switches",
            "Calls a model handed to the next of its chain, by cause: failed (an error or a time "
            "limit) or breaker_open (its endpoint's breaker is open).",
            ["model", "cause"],
            registry=r,
        )
        self.breaker_changes = Counter(
            "turnlog_model_breaker_changes",
            "State changes of model endpoints' circuit breakers, by the state entered.",
            ["model", "to_state"],
            registry=r,
        )
        self.breaker_open = Gauge(
            "turnlog_model_breaker_open",
            "1 while a worker's breaker of a model endpoint is open or half-open, else 0.",
            ["model", "endpoint", "worker"],
            registry=r,
        )
        self.endpoint_waits = Counter(
            "turnlog_model_endpoint_waits",
            "Model calls that waited for their endpoint's client-side limits or a 429's reset.",
            ["model"],
            registry=r,
        )

    def _context_and_state_metrics(self, r: CollectorRegistry) -> None:
        self.context_compactions = Counter(
            "turnlog_context_compactions",
            "Context trims and summaries by kind and reason (seed §3.2).",
            ["kind", "reason"],
            registry=r,
        )
        self.context_overflows = Counter(
            "turnlog_context_overflows",
            "Context overflow alerts: a provider refused a request as too long (context_length), "
            "tool results cut to fit (oversized), a summariser that failed (summary_fallback).",
            ["kind"],
            registry=r,
        )
        self.active_sessions = Gauge(
            "turnlog_active_sessions", "Open sessions by state.", ["state"], registry=r
        )
        self.consumer_lag = Gauge(
            "turnlog_consumer_lag_records",
            "Records a consumer group has not processed yet.",
            ["group", "partition"],
            registry=r,
        )

    # -- from the live hub ------------------------------------------------------------------------

    def on_live(self, item: StreamItem) -> None:
        if isinstance(item, ev.ModelCallStarted):
            self._first_token_wait[(item.session_id, item.turn_id, item.step)] = (
                time.monotonic(),
                item.model,
            )
        elif isinstance(item, ModelDelta):
            started = self._first_token_wait.pop((item.session_id, item.turn_id, item.step), None)
            if started is not None:
                self.ttft.labels(started[1]).observe(time.monotonic() - started[0])
        elif isinstance(item, ev.ModelCallFinished):
            self._first_token_wait.pop((item.session_id, item.turn_id, item.step), None)
        elif isinstance(item, ModelWaiting) and item.waiting:
            self.endpoint_waits.labels(item.model).inc()

    # -- from the log -----------------------------------------------------------------------------

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.SessionCreated):
            self._session_models[event.session_id] = event.model
        elif isinstance(event, ev.ModelCallFinished):
            self.model_calls.labels(event.model, event.status).inc()
            if event.status != "ok":
                self.model_errors.labels(event.model).inc()
            if event.model != self._session_models.get(event.session_id, event.model):
                self.model_fallbacks.labels(event.model).inc()
        elif isinstance(event, ev.ToolCallFinished):
            self.tool_calls.labels(event.tool_name, event.status).inc()
            sid = event.session_id
            self._session_tool_calls[sid] = self._session_tool_calls.get(sid, 0) + 1
            self._turn_tool_calls[event.turn_id] = self._turn_tool_calls.get(event.turn_id, 0) + 1
        elif isinstance(event, ev.TurnFinished):
            self.turns.labels(event.reason).inc()
            self.tool_calls_per_turn.observe(self._turn_tool_calls.pop(event.turn_id, 0))
        elif isinstance(event, ev.SessionClosed):
            self.tool_calls_per_session.observe(self._session_tool_calls.pop(event.session_id, 0))
            self._session_models.pop(event.session_id, None)
        elif isinstance(event, (ev.ContextTrimmed, ev.HistorySummarized)):
            self._on_compaction(event)
        elif isinstance(event, (ev.ModelFallback, ev.ModelBreakerChanged)):
            self._on_outage(event)

    def _on_outage(self, event: ev.ModelFallback | ev.ModelBreakerChanged) -> None:
        if isinstance(event, ev.ModelFallback):
            self.model_switches.labels(event.from_model, event.cause).inc()
            return
        self.breaker_changes.labels(event.model, event.to_state).inc()
        opened = 0 if event.to_state == "closed" else 1
        self.breaker_open.labels(event.model, event.endpoint, event.producer).set(opened)

    def _on_compaction(self, event: ev.ContextTrimmed | ev.HistorySummarized) -> None:
        if isinstance(event, ev.HistorySummarized):
            self.context_compactions.labels("summarized", event.reason).inc()
            if event.reason == "context_length":
                self.context_overflows.labels("context_length").inc()
            if event.fallback:
                self.context_overflows.labels("summary_fallback").inc()
            return
        reasons = {item["reason"] for item in json.loads(event.items_json)}
        for reason in sorted(reasons):
            self.context_compactions.labels("trimmed", reason).inc()
        if "oversized" in reasons:
            self.context_overflows.labels("oversized").inc()

    # -- scrape -----------------------------------------------------------------------------------

    async def render(self) -> tuple[bytes, str]:
        if self.state_source is not None:
            self.active_sessions.clear()
            for state, count in self.state_source().items():
                self.active_sessions.labels(state).set(count)
        if self.lag_source is not None:
            for (group, partition), lag in (await self.lag_source()).items():
                self.consumer_lag.labels(group, str(partition)).set(lag)
        text = generate_latest(self.registry)
        if self.text_source is not None:
            text += self.text_source().encode()
        return text, CONTENT_TYPE_LATEST
