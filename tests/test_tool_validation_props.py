"""Property: whatever JSON (or non-JSON) a model sends as arguments, validation never raises
and either accepts or answers with specific problems that name the field and what was sent."""

from __future__ import annotations

import datetime
import json
from typing import Any, Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnlog.engine import Tool, ToolRegistry, tool
from turnlog.engine.tools import ArgumentProblem, parse_arguments
from turnlog.engine.tools.execute import ToolOutcome, prepare


@tool
def book(day: datetime.date, seats: int, cabin: Literal["economy", "business"] = "economy") -> str:
    """Typed function tool (pydantic fast path)."""
    return "ok"


SCHEMA_TOOL = Tool(
    name="notify",
    description="JSON Schema tool (the MCP path)",
    parameters={
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email"},
            "at": {"type": "string", "format": "date-time"},
            "channel": {"enum": ["mail", "sms"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["email", "at"],
        "additionalProperties": False,
    },
    handler=lambda **kw: "sent",
)
TOOLS = (book, SCHEMA_TOOL)
FIELDS = {"day", "seats", "cabin", "email", "at", "channel", "tags", "priority"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
field_objects = st.dictionaries(st.sampled_from(sorted(FIELDS | {"extra", "Day"})), json_values, max_size=6)


def check(t: Tool, raw: str) -> None:
    result = parse_arguments(t, raw)
    if isinstance(result, dict):
        return
    assert isinstance(result, ArgumentProblem) and result.problems
    for problem in result.problems:
        assert problem and "Traceback" not in problem
        named = any(f in problem for f in FIELDS | {"arguments", "extra", "Day"})
        assert named, f"the problem names no field: {problem!r}"
    outcome = prepare(ToolRegistry([t]), t.name, raw)
    assert isinstance(outcome, ToolOutcome) and outcome.content.startswith("[REJECTED] invalid arguments")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TOOLS), json_values)
def test_any_json_value_gets_an_answer(t: Tool, value: Any) -> None:
    check(t, json.dumps(value))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TOOLS), field_objects)
def test_objects_with_known_and_unknown_fields_get_specific_messages(t: Tool, value: dict[str, Any]) -> None:
    check(t, json.dumps(value))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(TOOLS), st.text(max_size=60))
def test_arbitrary_text_never_crashes(t: Tool, raw: str) -> None:
    check(t, raw)


def test_pathological_inputs() -> None:
    for t in TOOLS:
        for raw in ["[" * 100_000, "{" * 50_000, '{"day": ' * 20_000, "NaN", "1e999", "\ud800", "\x00"]:
            check(t, raw)


def test_formats_and_enum_messages_say_what_was_expected_and_sent() -> None:
    sent = {"email": "not-an-address", "at": "next tuesday", "channel": "pigeon"}
    problems = parse_arguments(SCHEMA_TOOL, json.dumps(sent))
    assert isinstance(problems, ArgumentProblem)
    assert problems.problems == (
        "at must be an ISO 8601 date-time such as 2025-01-15T09:30:00Z, got 'next tuesday'",
        "channel must be one of 'mail', 'sms', got 'pigeon'",
        "email must be an email address, got 'not-an-address'",
    )
    ok = parse_arguments(SCHEMA_TOOL, json.dumps({"email": "a@b.io", "at": "2025-01-15T09:30:00+01:00"}))
    assert ok == {"email": "a@b.io", "at": "2025-01-15T09:30:00+01:00"}


def _turn_with_raw_arguments(raw: str) -> tuple[list[str], str]:
    """One real turn on an in-memory log whose model sends ``raw`` as book's arguments."""
    from turnlog.engine import (
        Agent,
        AgentDirectory,
        AgentSessions,
        FunctionModel,
        ModelRequest,
        SqliteEventLog,
    )
    from turnlog.engine import events as ev
    from turnlog.engine.events import ToolCallSpec
    from turnlog.engine.models.base import ModelResponse

    def fn(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return ModelResponse("", (ToolCallSpec("c1", "book", raw),), finish_reason="tool_calls")
        return "answered"

    async def run() -> tuple[list[str], str]:
        log = SqliteEventLog(":memory:")
        api = AgentSessions(log, AgentDirectory([Agent.build("a", FunctionModel(fn), [book, SCHEMA_TOOL])]))
        sid = (await api.create_session("a", "u")).session_id
        async for _ in api.send_user_message(sid, "book it"):
            pass
        events = await log.read_session(sid)
        await log.close()
        statuses = [e.status for e in events if isinstance(e, ev.ToolCallFinished)]
        return statuses, [e for e in events if isinstance(e, ev.TurnFinished)][0].reason

    import asyncio

    return asyncio.run(run())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=40), json_values.map(json.dumps), field_objects.map(json.dumps)))
def test_arbitrary_arguments_never_crash_a_real_turn(raw: str) -> None:
    statuses, reason = _turn_with_raw_arguments(raw)
    assert statuses in (["success"], ["rejected"]) and reason == "answered"
