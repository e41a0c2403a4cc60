"""Observability derived from the event stream: logs, metrics and traces, fed by one consumer
group on the log (and by the live hub for what only the token stream shows)."""

from .consumer import GROUP, ObservabilityConsumer
from .logs import EventLogger, configure_json_logs
from .metrics import GatewayMetrics
from .redact import redact, redact_processor
from .traces import SpanBuilder

__all__ = [
    "GROUP",
    "EventLogger",
    "GatewayMetrics",
    "ObservabilityConsumer",
    "SpanBuilder",
    "configure_json_logs",
    "redact",
    "redact_processor",
]
