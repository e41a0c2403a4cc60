"""Logs, metrics and spans derived from the event stream by the observability consumer (and the
live hub for time to first token), checked against the events on the log."""

from __future__ import annotations

from pathlib import Path

import structlog
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from turnlog.consumers import TurnWorker
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    SqliteEventLog,
    ToolFailure,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.models.base import ModelRequest, ModelResponse
from turnlog.engine.stream import ModelDelta
from turnlog.gateway.hub import LiveHub
from turnlog.gateway.observe import EventLogger, GatewayMetrics, ObservabilityConsumer, SpanBuilder, redact
from turnlog.gateway.observe.logs import open_context, sampled

SECRET = "sk-live0123456789abcdefghijkl"
EMAIL = "pat@customer.example"


@tool
async def send(to: str, api_key: str) -> str:
    """Send a notice."""
    return f"sent to {to} using {api_key}"


@tool
async def flaky() -> str:
    """Always fails."""
    raise ToolFailure("the mail server refused the connection")


def answer(request: ModelRequest) -> ModelResponse | str:
    if request.messages[-1].role == "user":
        return reply("", call("send", {"to": EMAIL, "api_key": SECRET}, "c1"), call("flaky", {}, "c2"))
    return "Sent one notice; the other failed."


async def run_one_turn(
    tmp_path: Path, text: str = f"Notify {EMAIL}; my key is {SECRET}"
) -> tuple[SqliteEventLog, AgentSessions, GatewayMetrics, str]:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    agents = AgentDirectory(
        [Agent.build("notify", FunctionModel(answer, name="fn-model", chunk_chars=5), [send, flaky])]
    )
    api = AgentSessions(log, agents, producer="test")
    sid = (await api.create_session("notify", "alice")).session_id
    await api.post_user_message(sid, text)
    metrics = GatewayMetrics()
    hub = LiveHub()
    hub.observe(metrics.on_live)
    await TurnWorker(log, agents, on_item=hub.publish).poll_once()
    return log, api, metrics, sid


async def test_logs_carry_sizes_and_statuses_never_values_and_redact_secrets(tmp_path: Path) -> None:
    log, _, _, sid = await run_one_turn(tmp_path)
    with structlog.testing.capture_logs() as lines:
        await ObservabilityConsumer(log, logger=EventLogger()).poll_once()  # the defaults
    events = await log.read_session(sid)
    by_kind: dict[str, list[dict[str, object]]] = {}
    for line in lines:
        by_kind.setdefault(str(line["event"]), []).append(line)

    model_calls = [e for e in events if isinstance(e, ev.ModelCallFinished)]
    assert [
        (m["step"], m["input_tokens"], m["output_tokens"], m["status"]) for m in by_kind["model.call"]
    ] == [(e.step, e.input_tokens, e.output_tokens, e.status) for e in model_calls]
    transitions = [e for e in events if isinstance(e, ev.StateChanged)]
    assert [(t["from_state"], t["to_state"], t["cause"]) for t in by_kind["state.transition"]] == [
        (e.from_state, e.to_state, e.cause) for e in transitions
    ]
    tools = {str(t["tool"]): t for t in by_kind["tool.execution"]}
    requested = {e.tool_name: e for e in events if isinstance(e, ev.ToolCallRequested)}
    assert tools["send"]["argument_bytes"] == len(requested["send"].arguments_json.encode())
    assert tools["send"]["argument_keys"] == ["api_key", "to"]
    assert tools["send"]["status"] == "success" and tools["flaky"]["status"] == "failed"
    result = f"sent to {EMAIL} using {SECRET}"
    assert (
        tools["send"]["summary"] == f"text, {len(result)} chars, 1 line"
    )  # its shape: no log line outlives an erasure
    assert "turn.context" not in by_kind  # full context is opt-in (sample_rate 0 by default)
    everything = repr(lines)
    assert SECRET not in everything and EMAIL not in everything


async def test_one_in_n_turns_logs_its_full_context_marked_sampled(tmp_path: Path) -> None:
    log, _, _, sid = await run_one_turn(tmp_path)
    with structlog.testing.capture_logs() as lines:
        await ObservabilityConsumer(log, logger=EventLogger(sample_rate=1.0)).poll_once()
    (sealed,) = [line for line in lines if line["event"] == "turn.context"]
    assert "messages" not in sealed and SECRET not in repr(sealed)  # sealed with the session's key
    context = open_context(sealed, log.records)
    assert context["sampled"] is True and context["session_id"] == sid
    contents = [m["content"] for m in context["messages"]]  # type: ignore[attr-defined]
    assert contents[0] == "Notify [EMAIL]; my key is [REDACTED]"
    assert contents[-1] == "Sent one notice; the other failed."
    assert SECRET not in repr(context) and EMAIL not in repr(context)  # arguments included
    turn_ids = [ev.new_id() for _ in range(2000)]
    share = sum(sampled(t, 0.1) for t in turn_ids) / len(turn_ids)
    assert 0.05 < share < 0.15 and all(sampled(t, 0.1) == sampled(t, 0.1) for t in turn_ids[:50])


async def test_secrets_typed_into_a_message_are_redacted_in_the_sampled_context(tmp_path: Path) -> None:
    typed = (
        "Log in with password=hunter2, passwd: Tr0ub4dor& and api_key=k-9f8e7d; token=t0k3n "
        "secret=sesame, Authorization: Basic dXNlcjpwYXNz or Bearer abc123def456; "
        '{"db_password": "pa ss", "max_tokens": 100}'
    )
    log, _, _, sid = await run_one_turn(tmp_path, typed)
    with structlog.testing.capture_logs() as lines:
        await ObservabilityConsumer(log, logger=EventLogger(sample_rate=1.0)).poll_once()
    (sealed,) = [line for line in lines if line["event"] == "turn.context"]
    context = open_context(sealed, log.records)
    assert context["messages"][0]["content"] == (  # type: ignore[index]
        "Log in with password=[REDACTED], passwd: [REDACTED] and api_key=[REDACTED]; token=[REDACTED] "
        "secret=[REDACTED], Authorization: [REDACTED] or [REDACTED]; "
        '{"db_password": "[REDACTED]", "max_tokens": 100}'
    )
    everything = repr(lines) + repr(context)
    for value in (
        "hunter2",
        "Tr0ub4dor",
        "k-9f8e7d",
        "t0k3n",
        "sesame",
        "dXNlcjpwYXNz",
        "abc123def456",
        "pa ss",
    ):
        assert value not in everything, value


def test_secrets_written_as_key_and_value_keep_their_key() -> None:
    cases = {
        "https://shop.example/orders?token=abc&page=2 ok": "https://shop.example/orders?token=[REDACTED] ok",
        "(pwd=a;b&c) and": "(pwd=[REDACTED]) and",
        "X-Api-Key: 123abc, then": "X-Api-Key: [REDACTED], then",
        "{'client_secret': 'cs-1'}": "{'client_secret': '[REDACTED]'}",
        "input_tokens=12 max_tokens: 100 tokens=5": "input_tokens=12 max_tokens: 100 tokens=5",
        "the password is hunter2": "the password is hunter2",  # no key and value written out
    }
    assert {text: redact(text) for text in cases} == cases


def test_redaction_by_key_name_and_by_pattern() -> None:
    data = {
        "password": "hunter2",
        "input_tokens": 12,
        "headers": {"Authorization": "Bearer abc.def.ghi-123", "x": "ok"},
        "note": f"use {SECRET} or AKIAABCDEFGHIJKLMNOP",
        "items": [{"api_key": "k"}, "tlk_" + "a" * 30],
    }
    assert redact(data) == {
        "password": "[REDACTED]",
        "input_tokens": 12,
        "headers": {"Authorization": "[REDACTED]", "x": "ok"},
        "note": "use [REDACTED] or [REDACTED]",
        "items": [{"api_key": "[REDACTED]"}, "[REDACTED]"],
    }


def test_json_log_lines_are_redacted_and_stamped() -> None:
    """`turnlog serve`'s processor chain, as configured: every field a caller logs is redacted;
    the level and time stamp it adds after the redaction come out as they are."""
    import io
    import json

    from turnlog.gateway.observe.logs import configure_json_logs

    stream, before = io.StringIO(), structlog.get_config()
    configure_json_logs(stream)
    try:
        structlog.get_logger("turnlog.test").info(
            "tool.execution", api_key="k-123", summary=f"used {SECRET}", session_id="s-1", attempts=2
        )
    finally:
        structlog.configure(**before)
    line = json.loads(stream.getvalue())
    assert {k: line[k] for k in ("api_key", "summary", "session_id", "attempts", "event", "level")} == {
        "api_key": "[REDACTED]",
        "summary": "used [REDACTED]",
        "session_id": "s-1",
        "attempts": 2,
        "event": "tool.execution",
        "level": "info",
    }
    assert line["timestamp"].endswith("Z") and line["timestamp"][:2] == "20"


async def test_metrics_follow_the_events(tmp_path: Path) -> None:
    log, api, metrics, sid = await run_one_turn(tmp_path)
    consumer = ObservabilityConsumer(log, logger=EventLogger(0), metrics=metrics)
    await consumer.poll_once()
    await api.force_finish(sid, "done")
    await consumer.poll_once()
    value = metrics.registry.get_sample_value
    assert value("turnlog_tool_calls_total", {"tool": "send", "status": "success"}) == 1
    assert value("turnlog_tool_calls_total", {"tool": "flaky", "status": "failed"}) == 1
    assert value("turnlog_model_calls_total", {"model": "fn-model", "status": "ok"}) == 2
    assert value("turnlog_model_errors_total", {"model": "fn-model"}) is None
    assert value("turnlog_tool_calls_per_turn_sum") == 2
    assert (
        value("turnlog_tool_calls_per_session_sum") == 2
        and value("turnlog_tool_calls_per_session_count") == 1
    )
    # only the second model call streamed text, so only it has a time to first token
    assert value("turnlog_time_to_first_token_seconds_count", {"model": "fn-model"}) == 1
    assert value("turnlog_turns_total", {"reason": "answered"}) == 1


async def test_spans_follow_the_genai_conventions_with_event_times(tmp_path: Path) -> None:
    log, _, _, sid = await run_one_turn(tmp_path)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans_from = SpanBuilder(provider.get_tracer("test"))
    await ObservabilityConsumer(log, logger=EventLogger(0), spans=spans_from).poll_once()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert sorted(spans) == [
        "chat fn-model",
        "execute_tool flaky",
        "execute_tool send",
        "invoke_agent notify",
    ]
    assert len(exporter.get_finished_spans()) == 5  # two chat spans
    events = await log.read_session(sid)
    turn = spans["invoke_agent notify"]
    started = next(e for e in events if isinstance(e, ev.TurnStarted))
    finished = next(e for e in events if isinstance(e, ev.TurnFinished))
    assert (turn.start_time, turn.end_time) == (started.time_ms * 10**6, finished.time_ms * 10**6)
    assert turn.attributes is not None and turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.usage.input_tokens"] == finished.input_tokens
    for span in exporter.get_finished_spans():
        if span is not turn:
            assert span.parent is not None and span.parent.span_id == turn.context.span_id
            assert span.context.trace_id == turn.context.trace_id
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    model_events = [e for e in events if isinstance(e, ev.ModelCallFinished)]
    assert [(s.kind, s.attributes["gen_ai.usage.output_tokens"]) for s in chats] == [  # type: ignore[index]
        (SpanKind.CLIENT, e.output_tokens) for e in model_events
    ]
    assert spans["execute_tool flaky"].status.status_code == StatusCode.ERROR
    assert spans["execute_tool send"].attributes["gen_ai.tool.call.id"] == "c1"  # type: ignore[index]


def test_a_failing_observer_never_breaks_the_publisher() -> None:
    hub = LiveHub()
    seen: list[object] = []

    def broken(item: object) -> None:
        raise RuntimeError("observer bug")

    hub.observe(broken)
    hub.observe(seen.append)
    queue = hub.subscribe("s1")
    delta = ModelDelta("s1", "t1", 0, "hi")
    with structlog.testing.capture_logs() as lines:
        hub.publish(delta)
    assert seen == [delta] and queue.get_nowait() == delta
    assert [line["event"] for line in lines] == ["hub.observer_failed"]


async def test_context_compactions_and_overflow_alerts_are_counted(tmp_path: Path) -> None:
    from tests.context_support import open_session
    from turnlog.engine import ContextPolicy, ModelError

    @tool(idempotent=True, max_result_chars=100_000)
    def export(name: str) -> str:
        """Export a table."""
        return "row; " * 8000

    def broken_summariser(request: ModelRequest) -> str:
        raise ModelError("summariser down")

    def rule(request: ModelRequest) -> ModelResponse | str:
        if request.messages[-1].role == "user" and request.messages[-1].content == "export":
            return reply("", call("export", {"name": "orders"}))
        return "Checked the next batch of deliveries; nothing unusual in it at all. " * 10

    policy = ContextPolicy(window=4096, summarizer=FunctionModel(broken_summariser, name="cheap"))
    session = await open_session(tmp_path, rule, [export], context=policy)
    await session.send("export")
    for _ in range(12):
        await session.send("Continue with the next batch.")
    metrics = GatewayMetrics()
    await ObservabilityConsumer(session.log, logger=EventLogger(0), metrics=metrics).poll_once()
    value = metrics.registry.get_sample_value
    summaries = len(await session.of(ev.HistorySummarized))
    assert (
        summaries
        and value("turnlog_context_compactions_total", {"kind": "summarized", "reason": "tokens"})
        == summaries
    )
    assert value("turnlog_context_overflows_total", {"kind": "summary_fallback"}) == summaries
    assert value("turnlog_context_overflows_total", {"kind": "oversized"}) >= 1
    assert value("turnlog_context_compactions_total", {"kind": "trimmed", "reason": "oversized"}) >= 1
