"""Loop guards (seed §4.3): near-equal arguments defined and tested at its edges, and each of
the three guards stopping a real turn with its own event, reason, cause and closing call."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

import pytest

from tests.tool_harness import of, open_session, path, since_user, tool_results
from turnlog.engine import Agent, FunctionModel, ModelRequest, ToolFailure, ToolStatus, call, reply, tool
from turnlog.engine import events as ev
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.tools import execute
from turnlog.engine.tools.guards import (
    CallRecord,
    canonical_arguments,
    near_equal,
    repeated_call,
    unchanged_result,
)

# --- near-equal arguments -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('{"city": "Oslo", "days": 3}', '{"days": 3, "city": "Oslo"}'),  # key order
        ('{"city": "Oslo"}', '{"city": "  oslo "}'),  # case and surrounding space
        ('{"q": "new   york\\tcity"}', '{"q": "New York City"}'),  # inner whitespace runs
        ('{"days": 3}', '{"days": 3.0}'),  # number formatting
        ('{"days": 30}', '{"days": 3e1}'),
        ('{"a": {"b": [1, "X"]}}', '{"a": {"b": [1.0, "x"]}}'),  # nested
        ("", "{}"),  # no arguments
        ('{ "city" : "Oslo" }', '{"city":"Oslo"}'),  # JSON whitespace
        ("not json  AT all", "Not JSON at all"),  # unparseable text is compared as one string
    ],
)
def test_near_equal(a: str, b: str) -> None:
    assert near_equal(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('{"days": 1}', '{"days": "1"}'),  # a number is not its string
        ('{"flag": true}', '{"flag": 1}'),  # true is not 1
        ('{"flag": false}', '{"flag": 0}'),
        ('{"x": null}', '{"x": "null"}'),
        ('{"ids": [1, 2]}', '{"ids": [2, 1]}'),  # list order matters
        ('{"city": "Oslo"}', '{"city": "Oslo", "days": 1}'),  # an extra argument
        ('{"q": "newyork"}', '{"q": "new york"}'),  # whitespace is collapsed, not removed
        ('{"n": 0.1}', '{"n": 0.10000001}'),  # near in value is not near-equal
    ],
)
def test_not_near_equal(a: str, b: str) -> None:
    assert not near_equal(a, b)


def test_canonical_form_survives_nasty_input() -> None:
    deep = "[" * 5000 + "]" * 5000
    assert canonical_arguments(deep)  # does not raise
    assert canonical_arguments('{"n": NaN}') == canonical_arguments('{"n": NaN}')
    assert canonical_arguments(str(2**80)) != canonical_arguments(str(2**80 + 1)), "big ints keep precision"


def rec(name: str, args: str, step: int, result: str = "r") -> CallRecord:
    return CallRecord(f"c{step}-{name}-{args}", name, args, step, "success", result)


def test_repeated_call_counts_consecutive_calls_only() -> None:
    a, b = '{"city": "Oslo"}', '{"city": " OSLO"}'
    assert repeated_call([rec("w", a, 1), rec("w", b, 2)], "w", a) is not None
    assert repeated_call([rec("w", a, 1)], "w", a) is None, "two in a row is allowed"
    assert repeated_call([rec("w", a, 1), rec("x", "{}", 2), rec("w", a, 3)], "w", a) is None, "not in a row"
    assert repeated_call([rec("w", a, 1), rec("w", a, 2)], "v", a) is None, "another tool"
    assert repeated_call([rec("w", a, 1), rec("w", a, 2)], "w", '{"city": "Bergen"}') is None


def test_unchanged_result_needs_three_steps_in_a_row_and_ignores_one_step() -> None:
    same = [rec("w", f'{{"p": {i}}}', i, "same") for i in (1, 2, 3)]
    trip = unchanged_result(same)
    assert trip is not None and trip.tool_name == "w" and "steps 1-3" in trip.reason
    assert unchanged_result(same[:2]) is None, "unchanged once is allowed"
    one_step = [rec("w", f'{{"p": {i}}}', 1, "same") for i in range(5)]
    assert unchanged_result(one_step) is None, "equal results of parallel calls are not a loop"
    changed = [*same[:2], rec("w", '{"p": 3}', 3, "new")]
    assert unchanged_result(changed) is None
    gap = [same[0], same[1], rec("x", "{}", 3), rec("w", '{"p": 4}', 4, "same")]
    assert unchanged_result(gap) is None, "step 3 did not call w: not in a row"


def test_outcomes_the_engine_wrote_are_never_one_result() -> None:
    """Three different calls each interrupted by a crash read alike (the text names only the
    tool); they are three calls whose results nobody saw, not an unchanged result."""
    text = execute.interrupted("cancel_reservation").content
    calls = [
        CallRecord(f"c{i}", "cancel_reservation", f'{{"id": "R-{i}"}}', i, "interrupted", text)
        for i in (1, 2, 3)
    ]
    assert unchanged_result(calls) is None
    for status in ("timeout", "abandoned", "cancelled", "rejected", "declined"):
        same = [dataclasses.replace(c, status=status, result=f"{status}:same text") for c in calls]
        assert unchanged_result(same) is None, status
    failed = [dataclasses.replace(c, status="failed", result="failed:[FAILED] not found") for c in calls]
    assert unchanged_result(failed) is not None, "a tool's own failure answer is a result like any"


# --- the guards in a real turn -----------------------------------------------------------------

counter = itertools.count()


@tool(idempotent=True)
def search(query: str) -> str:
    """Search the catalogue."""
    return f"hit #{next(counter)} for {query}"  # always a new result


@tool(idempotent=True)
def stock(item: str) -> str:
    """Stock level of an item."""
    return "12 in stock"  # never changes


def model_calling(make_args: Any, tool_name: str) -> FunctionModel:
    def fn(request: ModelRequest) -> Any:
        if not request.tools:
            return "Here is what I have so far."
        n = len(tool_results(since_user(request.messages)))
        return reply("", call(tool_name, make_args(n), f"c{n}"))

    return FunctionModel(fn)


async def test_repeated_call_guard_stops_before_the_third_near_equal_call(log: Any) -> None:
    queries = ["Red Shoes", "red shoes ", "RED  shoes"]
    s = await open_session(log, model_calling(lambda n: {"query": queries[n]}, "search"), [search])
    streamed = await s.send("find red shoes")
    events = await s.events()
    # the user sees it in the stream, and the CLI renders why the run was cut short
    from rich.console import Console

    from turnlog.render import LiveRenderer

    console = Console(record=True, width=200)
    render = LiveRenderer(console)
    for item in streamed:
        render(item)
    shown = console.export_text()
    assert "guard   repeated_call: search was asked for 3 times in a row" in shown
    assert "turn    finished: repeated_call" in shown
    finished = of(events, ev.ToolCallFinished)
    assert [f.status for f in finished] == ["success", "success", "rejected"]
    assert finished[2].content.startswith(
        "[REJECTED] search was not run: search was asked for 3 times in a row"
    )
    assert not [e for e in of(events, ev.ToolCallStarted) if e.call_id == "c2"], "the third call never ran"
    (guard,) = of(events, ev.LoopGuardTriggered)
    assert (guard.guard, guard.tool_name) == ("repeated_call", "search")
    assert path(events)[-1] == ("PROCESSING", "FINISHED", "guard")
    finished_turn = of(events, ev.TurnFinished)[0]
    assert finished_turn.reason == "repeated_call"
    closing = s.model.requests[-1]
    assert list(closing.tools) == [] and "near-equal arguments" in closing.messages[-1].content
    assert "cut short to avoid a loop" in closing.messages[-1].content
    assert of(events, ev.AssistantMessage)[-1].text == "Here is what I have so far."


async def test_unchanged_result_guard_stops_after_the_same_result_three_steps_running(
    log: Any, tmp_path: Any
) -> None:
    s = await open_session(log, model_calling(lambda n: {"item": f"sku-{n}"}, "stock"), [stock])
    await s.send("stock?")
    events = await s.events()
    assert len(of(events, ev.ToolCallFinished)) == 3
    (guard,) = of(events, ev.LoopGuardTriggered)
    assert guard.guard == "unchanged_result" and "3 tool steps in a row" in guard.reason
    assert of(events, ev.TurnFinished)[0].reason == "unchanged_result"
    assert path(events)[-1] == ("PROCESSING", "FINISHED", "guard")
    assert "same result" in s.model.requests[-1].messages[-1].content
    store = await s.project(tmp_path / "p.db")
    (turn,) = store.rows_of("turns", s.sid)
    assert (turn["outcome"], turn["guard"], turn["guard_reason"]) == (
        "unchanged_result",
        guard.guard,
        guard.reason,
    )
    assert store.rows_of("state_changes", s.sid)[-1]["detail"] == f"unchanged_result: {guard.reason}"


async def test_new_results_and_new_arguments_run_until_the_iteration_cap(log: Any) -> None:
    s = await open_session(
        log, model_calling(lambda n: {"query": f"page {n}"}, "search"), [search], max_tool_iterations=5
    )
    await s.send("browse")
    events = await s.events()
    assert len(of(events, ev.ToolCallFinished)) == 5
    assert [g.guard for g in of(events, ev.LoopGuardTriggered)] == ["iteration_cap"]
    assert path(events)[-1] == ("PROCESSING", "FINISHED", "guard")
    assert of(events, ev.TurnFinished)[0].reason == "iteration_cap"


async def test_guard_counts_restart_with_each_turn(log: Any) -> None:
    s = await open_session(
        log,
        FunctionModel(
            lambda r: reply("", call("stock", {"item": "a"}, "c")) if r.messages[-1].role == "user" else "12"
        ),
        [stock],
    )
    for _ in range(3):
        await s.send("stock of a?")
    events = await s.events()
    assert of(events, ev.LoopGuardTriggered) == []
    assert [t.reason for t in of(events, ev.TurnFinished)] == ["answered"] * 3
    assert all(f.status == ToolStatus.SUCCESS for f in of(events, ev.ToolCallFinished))


# --- final tools: the task's last step ends the tool loop -------------------------------------------


def _filer(outcomes: list[str]) -> Any:
    @tool
    def file_report(title: str) -> str:
        """File the report (the task's last step)."""
        if outcomes.pop(0) == "fail":
            raise ToolFailure("the archive is read-only right now")
        return f"filed {title}"

    return file_report


def _keeps_calling(request: ModelRequest) -> Any:
    if not request.tools:
        return "Filed: the report is in the archive."
    n = len(tool_results(since_user(request.messages)))
    if n == 0:
        return reply("", call("search", {"query": "late orders"}, "c0"))
    return reply("", call("file_report", {"title": f"weekly {n}"}, f"c{n}"))  # would go on forever


async def test_a_final_tool_that_succeeds_ends_the_loop_and_the_model_answers_without_tools(log: Any) -> None:
    tools = [search, _filer(["ok"])]
    s = await open_session(log, FunctionModel(_keeps_calling), tools, final_tools={"file_report"})
    await s.send("find late orders and file the report")
    events = await s.events()
    assert [f.tool_name for f in of(events, ev.ToolCallFinished)] == ["search", "file_report"]
    assert of(events, ev.LoopGuardTriggered) == []
    closing = s.model.requests[-1]
    assert list(closing.tools) == [] and closing.messages[-1].role == "system"
    assert closing.messages[-1].content.startswith("file_report has run: that completes the tool work")
    assert path(events)[-1] == ("PROCESSING", "FINISHED", "model_answer")
    assert of(events, ev.TurnFinished)[0].reason == "answered"
    assert of(events, ev.AssistantMessage)[-1].text == "Filed: the report is in the archive."


async def test_a_final_tool_that_fails_does_not_end_the_loop(log: Any) -> None:
    tools = [search, _filer(["fail", "ok"])]
    s = await open_session(log, FunctionModel(_keeps_calling), tools, final_tools={"file_report"})
    await s.send("find late orders and file the report")
    events = await s.events()
    assert [(f.tool_name, f.status) for f in of(events, ev.ToolCallFinished)] == [
        ("search", "success"),
        ("file_report", "failed"),
        ("file_report", "success"),
    ]
    assert of(events, ev.TurnFinished)[0].reason == "answered" and len(s.model.requests) == 4


def test_final_tools_must_be_tools_of_the_agent() -> None:
    with pytest.raises(ConfigurationError, match=r"final_tools names tools it does not have: \['publish'\]"):
        Agent("a", FunctionModel(lambda r: "x"), [search], final_tools={"publish"})


async def test_distinct_calls_that_time_out_do_not_trip_the_unchanged_result_guard(log: Any) -> None:
    @tool(timeout_s=0.05)
    async def cancel_reservation(reservation: str) -> str:
        """Cancel a reservation (its service never answers here)."""
        await asyncio.Event().wait()
        return "unreachable"

    s = await open_session(
        log,
        model_calling(lambda n: {"reservation": f"R-{n}"}, "cancel_reservation"),
        [cancel_reservation],
        max_tool_iterations=4,
    )
    await s.send("cancel my four reservations")
    events = await s.events()
    finished = of(events, ev.ToolCallFinished)
    assert [f.status for f in finished] == ["timeout"] * 4
    assert len({f.content for f in finished}) == 1, "the four failures read alike"
    assert [g.guard for g in of(events, ev.LoopGuardTriggered)] == ["iteration_cap"]
    assert of(events, ev.TurnFinished)[0].reason == "iteration_cap"
