"""OpenTelemetry spans rebuilt from the log, following the GenAI semantic conventions.

A turn is an ``invoke_agent {agent}`` span; inside it every model call is a ``chat {model}`` span
and every tool call an ``execute_tool {tool}`` span. Start and end times are the events' own
times, so the spans are the same whether they are built live or from a replay. Export is the
TracerProvider's business (an OTLP exporter in production, the in-memory one in tests).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from turnlog.engine import events as ev

OP = "gen_ai.operation.name"


def _ns(event: ev.Event) -> int:
    return event.time_ms * 1_000_000


class SpanBuilder:
    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self._agents: dict[str, str] = {}
        self._turns: dict[str, Span] = {}
        self._models: dict[tuple[str, int], Span] = {}
        self._tools: dict[tuple[str, str], Span] = {}

    def on_event(self, event: ev.Event) -> None:
        handler = getattr(self, f"_on_{event.type}", None)
        if handler is not None:
            handler(event)

    def _start(
        self, name: str, event: ev.Event, turn_id: str, kind: SpanKind, attributes: dict[str, Any]
    ) -> Span:
        parent = self._turns.get(turn_id)
        context = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(name, context, kind, attributes, start_time=_ns(event))

    def _on_SessionCreated(self, event: ev.SessionCreated) -> None:
        self._agents[event.session_id] = event.agent_id

    def _on_TurnStarted(self, event: ev.TurnStarted) -> None:
        agent = self._agents.get(event.session_id, "agent")
        self._turns[event.turn_id] = self.tracer.start_span(
            f"invoke_agent {agent}",
            kind=SpanKind.INTERNAL,
            attributes={
                OP: "invoke_agent",
                "gen_ai.agent.name": agent,
                "gen_ai.conversation.id": event.session_id,
                "turnlog.turn_id": event.turn_id,
                "turnlog.message_id": event.message_id,
            },
            start_time=_ns(event),
        )

    def _on_ModelCallStarted(self, event: ev.ModelCallStarted) -> None:
        self._models[(event.turn_id, event.step)] = self._start(
            f"chat {event.model}",
            event,
            event.turn_id,
            SpanKind.CLIENT,
            {
                OP: "chat",
                "gen_ai.request.model": event.model,
                "gen_ai.conversation.id": event.session_id,
                "turnlog.step": event.step,
                "turnlog.message_count": event.message_count,
                "turnlog.tools_offered": event.tools_offered,
            },
        )

    def _on_ModelCallFinished(self, event: ev.ModelCallFinished) -> None:
        span = self._models.pop((event.turn_id, event.step), None)
        if span is None:
            return
        span.set_attributes(
            {
                "gen_ai.response.model": event.model,
                "gen_ai.usage.input_tokens": event.input_tokens,
                "gen_ai.usage.output_tokens": event.output_tokens,
                "gen_ai.response.finish_reasons": [event.finish_reason] if event.finish_reason else [],
                "turnlog.retries": event.retries,
            }
        )
        if event.status != "ok":
            span.set_attribute("error.type", "model_error")
            span.set_status(Status(StatusCode.ERROR, event.error or "model call failed"))
        span.end(_ns(event))

    def _on_ToolCallStarted(self, event: ev.ToolCallStarted) -> None:
        key = (event.turn_id, event.call_id)
        if key in self._tools:  # a retry or a recovery re-run: one span per call
            self._tools[key].set_attribute("turnlog.attempt", event.attempt)
            return
        self._tools[key] = self._start(
            f"execute_tool {event.tool_name}",
            event,
            event.turn_id,
            SpanKind.INTERNAL,
            {
                OP: "execute_tool",
                "gen_ai.tool.name": event.tool_name,
                "gen_ai.tool.call.id": event.call_id,
                "gen_ai.tool.type": "function",
                "gen_ai.conversation.id": event.session_id,
            },
        )

    def _on_ToolCallFinished(self, event: ev.ToolCallFinished) -> None:
        span = self._tools.pop((event.turn_id, event.call_id), None)
        if span is None:
            return
        span.set_attributes({"turnlog.tool.status": event.status, "turnlog.tool.attempts": event.attempts})
        if event.status != "success":
            span.set_attribute("error.type", event.status)
            span.set_status(Status(StatusCode.ERROR, event.status))
        span.end(_ns(event))

    def _on_TurnFinished(self, event: ev.TurnFinished) -> None:
        for key in [k for k in self._models if k[0] == event.turn_id]:
            self._models.pop(key).end(_ns(event))
        for call in [k for k in self._tools if k[0] == event.turn_id]:
            self._tools.pop(call).end(_ns(event))
        span = self._turns.pop(event.turn_id, None)
        if span is None:
            return
        span.set_attributes(
            {
                "turnlog.turn.reason": event.reason,
                "turnlog.turn.iterations": event.iterations,
                "gen_ai.usage.input_tokens": event.input_tokens,
                "gen_ai.usage.output_tokens": event.output_tokens,
            }
        )
        if event.reason == "model_error":
            span.set_attribute("error.type", "model_error")
            span.set_status(Status(StatusCode.ERROR, "the turn ended on a model error"))
        span.end(_ns(event))

    def _on_SessionClosed(self, event: ev.SessionClosed) -> None:
        self._agents.pop(event.session_id, None)
