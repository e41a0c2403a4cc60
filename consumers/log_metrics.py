"""What a process's log holds in memory, as Prometheus text: the gateway appends it to its
/metrics, and every other long-running process serves it on its health port's /metrics.

Only the Kafka log bounds what it holds (``engine/log/kafka_held.py``): a process whose
``TURNLOG_KAFKA_INDEX_MB`` is below what the sessions it uses at once hold unloads sessions and
reads them back over and over, which shows in its CPU alone unless these counters are watched
(the two rise together). Written by hand, not with prometheus_client: a worker installs without
the gateway's extras.
"""

from __future__ import annotations

from typing import Callable

from turnlog.engine.log.base import EventLog
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_held import HeldUse

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus' text exposition format."""
FAMILIES: tuple[tuple[str, str, str, Callable[[HeldUse], int]], ...] = (
    ("turnlog_kafka_index_bytes", "gauge", "Estimated bytes of log records this process holds.",
     lambda use: use.held_bytes),
    ("turnlog_kafka_index_budget_bytes", "gauge", "What it may hold (TURNLOG_KAFKA_INDEX_MB).",
     lambda use: use.budget_bytes),
    ("turnlog_kafka_index_sessions_unloaded_total", "counter",
     "Idle sessions unloaded to stay within the budget.", lambda use: use.counts.unloaded),
    ("turnlog_kafka_index_sessions_loaded_total", "counter",
     "Sessions read back from the log (after an unload, or named by a takeover's session index).",
     lambda use: use.counts.loaded),
)  # fmt: skip
"""Each metric: name, type, help, its value."""


def log_metrics(event_log: EventLog) -> str:
    """The log's memory metrics in Prometheus' text format; empty for a log that holds no bounded
    index (the embedded and memory logs)."""
    if not isinstance(event_log, KafkaEventLog):
        return ""
    use = event_log.held_use()
    return "".join(
        f"# HELP {name} {doc}\n# TYPE {name} {kind}\n{name} {value(use)}\n"
        for name, kind, doc, value in FAMILIES
    )
