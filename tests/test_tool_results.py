"""Parallel calls, per-tool timeouts and retries, and results the model can use: status and
markers, formatters, truncation with a note (the full result stays on the log and in the
tool_calls projection), and superseded results marked for context management."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.tool_harness import of, open_session, since_user, tool_results
from turnlog.engine import (
    ConfigurationError,
    FunctionModel,
    ModelRequest,
    ToolFailure,
    ToolStatus,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.tools.shaping import list_summary, truncate

# --- parallel calls -----------------------------------------------------------------------------

attempts: dict[str, int] = {}


@tool(timeout_s=0.5)
async def slow(n: int) -> str:
    """Never finishes in time."""
    attempts["slow"] = attempts.get("slow", 0) + 1
    await asyncio.Event().wait()
    return "never"


@tool
def broken(n: int) -> str:
    """Always crashes."""
    attempts["broken"] = attempts.get("broken", 0) + 1
    raise RuntimeError("database is down")


@tool(idempotent=True, timeout_s=30)
async def quick(n: int) -> dict:
    """Answers at once."""
    await asyncio.sleep(0)
    return {"n": n, "double": n * 2}


def one_batch(*calls: Any) -> FunctionModel:
    def fn(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return reply("", *calls)
        return "summary: " + " | ".join(m.content for m in tool_results(since_user(request.messages)))

    return FunctionModel(fn)


async def test_one_slow_and_one_failing_call_do_not_lose_the_others(log: Any) -> None:
    attempts.clear()
    model = one_batch(
        call("slow", {"n": 1}, "s"),
        call("quick", {"n": 2}, "q1"),
        call("broken", {"n": 3}, "b"),
        call("quick", {"n": 4}, "q2"),
    )
    s = await open_session(log, model, [slow, broken, quick])
    await s.send("do all four")
    events = await s.events()
    started = of(events, ev.ToolCallStarted)
    finished = of(events, ev.ToolCallFinished)
    assert [e.call_id for e in started] == ["s", "q1", "b", "q2"], "all started in one commit before running"
    assert [(f.call_id, f.status) for f in finished] == [
        ("s", "timeout"),
        ("q1", "success"),
        ("b", "failed"),
        ("q2", "success"),
    ], "results in the order the model asked"
    assert finished[0].content.startswith("[FAILED: TIMEOUT] slow did not finish within 0.5 s")
    assert finished[2].content.startswith("[FAILED] broken RuntimeError: database is down")
    assert finished[1].output_json == '{"n":2,"double":4}'
    assert attempts == {"slow": 1, "broken": 1}, "not idempotent: no retry"
    sent = [m.tool_call_id for m in tool_results(s.model.requests[-1].messages)]
    assert sent == ["s", "q1", "b", "q2"], "the model got every result, in order"
    # the first event after the batch's ToolCallStarted events is a result: they ran concurrently
    # (a sequential run would have had to wait for the 0.5 s timeout of `slow` first; we assert the
    # order of results instead of times)


async def test_calls_of_one_step_overlap(log: Any) -> None:
    inside = 0
    peak = 0
    gate = asyncio.Event()

    @tool(idempotent=True, timeout_s=30)
    async def wait_for_all(n: int) -> int:
        """Waits until three calls are running at the same time."""
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        if inside == 3:
            gate.set()
        await gate.wait()
        inside -= 1
        return n

    s = await open_session(
        log, one_batch(*(call("wait_for_all", {"n": i}, f"w{i}") for i in range(3))), [wait_for_all]
    )
    await s.send("go")
    assert peak == 3, "three calls were inside the tool at once"


# --- timeouts and retry policy ------------------------------------------------------------------


async def test_retry_policy_defaults_and_overrides(log: Any) -> None:
    count = {"idem": 0, "plain": 0, "custom": 0, "business": 0}

    @tool(idempotent=True)
    def idem(n: int) -> str:
        """Fails once, then works."""
        count["idem"] += 1
        if count["idem"] == 1:
            raise ConnectionError("reset")
        return "ok"

    @tool
    def plain(n: int) -> str:
        """Fails once."""
        count["plain"] += 1
        raise ConnectionError("reset")

    @tool(retries=2)
    def custom(n: int) -> str:
        """Fails twice."""
        count["custom"] += 1
        if count["custom"] < 3:
            raise ConnectionError("reset")
        return "third time"

    @tool(idempotent=True)
    def business(n: int) -> str:
        """A business answer is final."""
        count["business"] += 1
        raise ToolFailure("order not found")

    model = one_batch(*(call(name, {"n": 1}, name) for name in count))
    s = await open_session(log, model, [idem, plain, custom, business])
    await s.send("go")
    finished = {f.call_id: f for f in of(await s.events(), ev.ToolCallFinished)}
    assert count == {"idem": 2, "plain": 1, "custom": 3, "business": 1}
    assert [(k, f.status, f.attempts) for k, f in finished.items()] == [
        ("idem", "success", 2),
        ("plain", "failed", 1),
        ("custom", "success", 3),
        ("business", "failed", 1),
    ]
    assert (idem.max_attempts, plain.max_attempts, custom.max_attempts) == (2, 1, 3)
    assert idem.timeout_s == 10.0, "the default timeout is 10 s"


def test_bad_policies_are_configuration_errors() -> None:
    def f(n: int) -> int:
        """Identity."""
        return n

    with pytest.raises(ConfigurationError, match="retries must be >= 0"):
        tool(retries=-1)(f)
    with pytest.raises(ConfigurationError, match="max_result_chars must be >= 500"):
        tool(max_result_chars=10)(f)


# --- shaping ------------------------------------------------------------------------------------


def test_truncate_keeps_short_text_and_notes_what_was_cut() -> None:
    assert truncate("short", 500) == "short"
    text = "x" * 5000
    cut = truncate(text, 1000)
    assert len(cut) <= 1000
    head, note = cut.split("\n[TRUNCATED: ")
    assert head == "x" * len(head)
    assert note.startswith(
        f"showing the first {len(head)} of 5000 characters; {5000 - len(head)} characters were cut"
    )


async def test_a_large_result_is_cut_for_the_model_but_kept_whole(log: Any, tmp_path: Path) -> None:
    rows = [
        {"order_id": f"A-{i}", "carrier": "DHL" if i % 3 else "UPS", "note": "n" * 40} for i in range(200)
    ]

    @tool(idempotent=True, max_result_chars=600)
    def orders(week: int) -> list:
        """Orders of a week."""
        return rows

    s = await open_session(log, one_batch(call("orders", {"week": 2}, "o")), [orders])
    await s.send("orders?")
    (finished,) = of(await s.events(), ev.ToolCallFinished)
    assert len(finished.content) <= 600 and "[TRUNCATED: showing the first" in finished.content
    assert json.loads(finished.output_json or "") == rows, "the log keeps the whole result"
    assert tool_results(s.model.requests[-1].messages)[0].content == finished.content
    store = await s.project(tmp_path / "p.db")
    (row,) = store.rows_of("tool_calls", s.sid)
    assert json.loads(row["output_json"]) == rows and row["content"] == finished.content


def test_list_summary_formatter() -> None:
    fmt = list_summary(["order_id", "carrier"], label="orders", show=2, count_by="carrier")
    rows = [
        {"order_id": "A", "carrier": "DHL", "x": 1},
        {"order_id": "B", "carrier": "UPS"},
        {"order_id": "C", "carrier": "DHL"},
    ]
    assert fmt(rows) == (
        "3 orders; by carrier: DHL 2, UPS 1. First 2:\n- order_id=A, carrier=DHL\n- order_id=B, carrier=UPS\n"
        "(and 1 more)"
    )
    assert fmt([]) == "0 orders."
    assert fmt({"not": "a list"}) == '{"not":"a list"}'


async def test_a_later_near_equal_call_supersedes_the_earlier_result(log: Any, tmp_path: Path) -> None:
    status = iter(["packed", "shipped"])

    @tool(idempotent=True)
    def track(order_id: str) -> str:
        """Where an order is."""
        return next(status)

    def fn(request: ModelRequest) -> Any:
        n = len(tool_results(since_user(request.messages)))
        if n < 2:
            return reply("", call("track", {"order_id": "a-1" if n else "A-1"}, f"t{n}"))
        return "it shipped"

    s = await open_session(log, FunctionModel(fn), [track])
    await s.send("where is A-1?")
    events = await s.events()
    (marked,) = of(events, ev.ToolResultSuperseded)
    assert (marked.call_id, marked.superseded_by) == ("t0", "t1")
    assert (await s.api.get_state(s.sid)).superseded == {"t0": "t1"}
    store = await s.project(tmp_path / "p.db")
    assert [(r["call_id"], r["superseded_by"]) for r in store.rows_of("tool_calls", s.sid)] == [
        ("t0", "t1"),
        ("t1", None),
    ]


async def test_a_failed_retry_does_not_supersede_a_good_result(log: Any) -> None:
    outcomes = iter(["packed", None])

    @tool(idempotent=True, retries=0)
    def track(order_id: str) -> str:
        """Where an order is."""
        value = next(outcomes)
        if value is None:
            raise ToolFailure("tracking service unavailable")
        return value

    def fn(request: ModelRequest) -> Any:
        n = len(tool_results(since_user(request.messages)))
        return reply("", call("track", {"order_id": "A-1"}, f"t{n}")) if n < 2 else "done"

    s = await open_session(log, FunctionModel(fn), [track])
    await s.send("where is A-1?")
    events = await s.events()
    assert [f.status for f in of(events, ev.ToolCallFinished)] == [ToolStatus.SUCCESS, ToolStatus.FAILED]
    assert of(events, ev.ToolResultSuperseded) == []
