"""Every path of the turn loop, driven through AgentSessions on a real SQLite log.

Each test asserts on what is observable: the events on the log (and the state path their
StateChanged events walk), the folded history, what the model was sent, and what was streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    ChatMessage,
    FunctionModel,
    InputError,
    MessageTooLargeError,
    Model,
    ModelDelta,
    ModelError,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    SessionClosedError,
    SessionNotFoundError,
    SqliteEventLog,
    TextDelta,
    Tool,
    ToolStatus,
    TurnRunner,
    call,
    codec,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.log.sqlite_layout import all_records
from turnlog.engine.models.base import ModelChunk

AGENT = "helper"


# --- harness ------------------------------------------------------------------------------------


@dataclass
class Harness:
    api: AgentSessions
    log: SqliteEventLog
    sid: str
    model: FunctionModel | CountingModel
    agent: Agent

    async def send(self, text: str) -> list[Any]:
        return [item async for item in self.api.send_user_message(self.sid, text)]

    async def run_pending(self) -> list[Any]:
        return [item async for item in self.api.run_pending(self.sid)]

    async def events(self) -> list[ev.Event]:
        return await self.log.read_session(self.sid)

    async def history(self) -> list[ChatMessage]:
        return await self.api.get_history(self.sid, limit=1000)


async def harness(log: SqliteEventLog, model: Model, tools: Sequence[Tool] = (), **options: Any) -> Harness:
    agent = Agent(AGENT, model, list(tools), **options)
    api = AgentSessions(log, AgentDirectory([agent]))
    info = await api.create_session(AGENT, "user-1")
    return Harness(api, log, info.session_id, model, agent)  # type: ignore[arg-type]


def types(events: Sequence[ev.Event]) -> list[str]:
    return [e.type for e in events]


def path(events: Sequence[ev.Event]) -> list[tuple[str, str, str]]:
    return [(e.from_state, e.to_state, e.cause) for e in events if isinstance(e, ev.StateChanged)]


def of(events: Sequence[Any], cls: type[ev.E]) -> list[ev.E]:
    return [e for e in events if isinstance(e, cls)]


def tool_messages(request: ModelRequest) -> list[ChatMessage]:
    return [m for m in request.messages if m.role == "tool"]


def last_is_tool(request: ModelRequest) -> bool:
    return request.messages[-1].role == "tool"


START = ["SessionCreated", "UserMessageReceived", "TurnStarted", "StateChanged"]
ANSWER = [
    "ModelCallStarted",
    "ModelCallFinished",
    "AssistantMessage",
    "StateChanged",
    "TurnFinished",
    "SnapshotTaken",  # every turn end is snapshotted (engine.snapshots)
]


def ask_tools(n: int) -> list[str]:
    return [
        "ModelCallStarted",
        "ModelCallFinished",
        "AssistantMessage",
        *["ToolCallRequested"] * n,
        "StateChanged",
    ]


def run_tools(n: int) -> list[str]:
    return [*["ToolCallStarted"] * n, *["ToolCallFinished"] * n, "StateChanged", "SnapshotTaken"]


class CountingModel(Model):
    """A model written as an async generator, for streams FunctionModel cannot express."""

    name = "counting"

    def __init__(self, script: Callable[[ModelRequest], AsyncIterator[ModelChunk]]) -> None:
        self.script = script
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        async for chunk in self.script(request):
            yield chunk


# --- tools used across tests --------------------------------------------------------------------

weather_calls: list[str] = []


@tool(idempotent=True)
def get_weather(city: str) -> str:
    """Current weather for a city."""
    weather_calls.append(city)
    return f"sunny, 21°C in {city}"


@pytest.fixture(autouse=True)
def _reset_weather() -> None:
    weather_calls.clear()


# --- answers without tools ----------------------------------------------------------------------


async def test_direct_answer(log: SqliteEventLog) -> None:
    answer = "Paris is the capital of France."
    model = FunctionModel(lambda r: answer, chunk_chars=6)
    h = await harness(log, model, [get_weather], system_prompt="Be brief.")

    streamed = await h.send("Capital of France?")

    events = await h.events()
    assert types(events) == START + ANSWER
    assert path(events) == [
        ("IDLE", "PROCESSING", "user_message"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]
    (started,) = of(events, ev.TurnStarted)
    (user,) = of(events, ev.UserMessageReceived)
    (finished,) = of(events, ev.TurnFinished)
    (model_done,) = of(events, ev.ModelCallFinished)
    assert started.message_id == user.message_id and started.causation_id == user.event_id
    assert all(e.correlation_id == started.turn_id for e in events[2:])
    assert (finished.reason, finished.iterations, finished.model_calls) == ("answered", 0, 1)
    assert model_done.status == "ok" and model_done.input_tokens > 0
    assert (finished.input_tokens, finished.output_tokens) == (
        model_done.input_tokens,
        model_done.output_tokens,
    )
    assert of(events, ev.AssistantMessage)[0].text == answer

    (request,) = model.requests
    assert list(request.messages) == [ChatMessage.system("Be brief."), ChatMessage.user("Capital of France?")]
    assert list(request.tools) == [get_weather.spec()]
    assert (request.session_id, request.turn_id) == (h.sid, started.turn_id)
    assert of(events, ev.ModelCallStarted)[0].tools_offered == 1

    assert await h.history() == [ChatMessage.user("Capital of France?"), ChatMessage("assistant", answer)]
    state = await h.api.get_state(h.sid)
    assert (state.status, state.turn, list(state.inbox), state.turns_finished) == ("FINISHED", None, [], 1)

    # the stream is every event from the user message on, plus the answer as deltas
    assert [i for i in streamed if isinstance(i, ev.Event)] == events[1:]
    deltas = [i for i in streamed if isinstance(i, ModelDelta)]
    assert len(deltas) == 6 and "".join(d.text for d in deltas) == answer
    assert all((d.session_id, d.turn_id, d.step) == (h.sid, started.turn_id, 0) for d in deltas)
    assert streamed.index(deltas[0]) > streamed.index(of(streamed, ev.ModelCallStarted)[0])
    assert streamed.index(deltas[-1]) < streamed.index(of(streamed, ev.ModelCallFinished)[0])


async def test_without_a_system_prompt_the_model_gets_only_the_conversation(log: SqliteEventLog) -> None:
    model = ScriptedModel(["Hi!"])
    h = await harness(log, model)
    await h.send("Hello")
    assert list(model.requests[0].messages) == [ChatMessage.user("Hello")]
    assert list(model.requests[0].tools) == []


# --- tools --------------------------------------------------------------------------------------


async def test_one_tool_call(log: SqliteEventLog) -> None:
    def weather_bot(request: ModelRequest) -> ModelResponse | str:
        if last_is_tool(request):
            return f"It is {request.messages[-1].content}."
        return reply("", call("get_weather", {"city": "Paris"}, "c1"))

    model = FunctionModel(weather_bot)
    h = await harness(log, model, [get_weather], system_prompt="Use tools.")
    await h.send("Weather in Paris?")

    events = await h.events()
    assert types(events) == START + ask_tools(1) + run_tools(1) + ANSWER
    assert path(events) == [
        ("IDLE", "PROCESSING", "user_message"),
        ("PROCESSING", "TOOL_WAIT", "model_tool_call"),
        ("TOOL_WAIT", "PROCESSING", "tool_result"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]
    (requested,) = of(events, ev.ToolCallRequested)
    (tstarted,) = of(events, ev.ToolCallStarted)
    (tdone,) = of(events, ev.ToolCallFinished)
    assert (
        requested.call_id,
        requested.tool_name,
        json.loads(requested.arguments_json),
        requested.iteration,
    ) == ("c1", "get_weather", {"city": "Paris"}, 1)
    assert (tstarted.call_id, tstarted.attempt) == ("c1", 1)
    assert (tdone.status, tdone.content, tdone.attempts, tdone.error) == (
        "success",
        "sunny, 21°C in Paris",
        1,
        None,
    )
    assert json.loads(tdone.output_json or "") == "sunny, 21°C in Paris"
    assert weather_calls == ["Paris"]

    first, second = model.requests
    assert list(second.messages) == [
        ChatMessage.system("Use tools."),
        ChatMessage.user("Weather in Paris?"),
        ChatMessage("assistant", "", (ev.ToolCallSpec("c1", "get_weather", '{"city": "Paris"}'),)),
        ChatMessage("tool", "sunny, 21°C in Paris", tool_call_id="c1", name="get_weather"),
    ]
    assert list(second.tools) == list(first.tools) == [get_weather.spec()]
    assert (await h.history())[-1] == ChatMessage("assistant", "It is sunny, 21°C in Paris.")
    (finished,) = of(events, ev.TurnFinished)
    assert (finished.reason, finished.iterations, finished.model_calls) == ("answered", 1, 2)


async def test_three_chained_tools(log: SqliteEventLog) -> None:
    @tool
    def find_customer(email: str) -> dict[str, str]:
        """Customer by email."""
        return {"customer_id": "C-7"}

    @tool
    def last_order(customer_id: str) -> dict[str, str]:
        """The customer's last order."""
        return {"order_id": f"{customer_id}/A-17"}

    @tool
    def track(order_id: str) -> str:
        """Where a parcel is."""
        return f"{order_id} is in Lyon"

    def support_bot(request: ModelRequest) -> ModelResponse | str:
        results = tool_messages(request)
        if len(results) == 0:
            return reply("Looking you up.", call("find_customer", {"email": "a@b.c"}, "t1"))
        if len(results) == 1:
            cid = json.loads(results[0].content)["customer_id"]
            return reply("", call("last_order", {"customer_id": cid}, "t2"))
        if len(results) == 2:
            return reply("", call("track", {"order_id": json.loads(results[1].content)["order_id"]}, "t3"))
        return f"Your parcel: {results[2].content}."

    model = FunctionModel(support_bot)
    h = await harness(log, model, [find_customer, last_order, track])
    await h.send("Where is my parcel?")

    events = await h.events()
    assert types(events) == START + (ask_tools(1) + run_tools(1)) * 3 + ANSWER
    assert path(events) == [
        ("IDLE", "PROCESSING", "user_message"),
        ("PROCESSING", "TOOL_WAIT", "model_tool_call"),
        ("TOOL_WAIT", "PROCESSING", "tool_result"),
        ("PROCESSING", "TOOL_LOOP", "model_tool_call"),
        ("TOOL_LOOP", "PROCESSING", "tool_result"),
        ("PROCESSING", "TOOL_LOOP", "model_tool_call"),
        ("TOOL_LOOP", "PROCESSING", "tool_result"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]
    assert [e.iteration for e in of(events, ev.ToolCallRequested)] == [1, 2, 3]
    assert [e.status for e in of(events, ev.ToolCallFinished)] == ["success"] * 3
    assert len(model.requests) == 4
    assert [(m.tool_call_id, m.name, m.content) for m in tool_messages(model.requests[3])] == [
        ("t1", "find_customer", '{"customer_id":"C-7"}'),
        ("t2", "last_order", '{"order_id":"C-7/A-17"}'),
        ("t3", "track", "C-7/A-17 is in Lyon"),
    ]
    assert [m.role for m in model.requests[3].messages] == ["user", "assistant", "tool"] * 1 + [
        "assistant",
        "tool",
    ] * 2
    (finished,) = of(events, ev.TurnFinished)
    assert (finished.reason, finished.iterations, finished.model_calls) == ("answered", 3, 4)
    assert (await h.history())[-1].content == "Your parcel: C-7/A-17 is in Lyon."


async def test_two_tool_calls_in_one_step_run_concurrently_and_results_keep_request_order(
    log: SqliteEventLog,
) -> None:
    alpha_started, beta_done = asyncio.Event(), asyncio.Event()
    completed: list[str] = []

    @tool(timeout_s=5)
    async def alpha() -> str:
        """Finishes only after beta did: impossible if the batch ran one call at a time."""
        alpha_started.set()
        await beta_done.wait()
        completed.append("alpha")
        return "alpha result"

    @tool(timeout_s=5)
    async def beta() -> str:
        """Needs alpha to be running already."""
        await alpha_started.wait()
        beta_done.set()
        completed.append("beta")
        return "beta result"

    def model_fn(request: ModelRequest) -> ModelResponse | str:
        if last_is_tool(request):
            return "both done"
        return reply("", call("alpha", {}, "a"), call("beta", {}, "b"))

    model = FunctionModel(model_fn)
    h = await harness(log, model, [alpha, beta])
    await h.send("go")

    events = await h.events()
    assert types(events) == START + ask_tools(2) + run_tools(2) + ANSWER
    finished = of(events, ev.ToolCallFinished)
    assert [(f.call_id, f.status, f.content) for f in finished] == [
        ("a", "success", "alpha result"),
        ("b", "success", "beta result"),
    ]
    assert completed == ["beta", "alpha"], "beta finished first, yet results are in request order"
    assert [(m.tool_call_id, m.content) for m in tool_messages(model.requests[1])] == [
        ("a", "alpha result"),
        ("b", "beta result"),
    ]


async def test_bad_arguments_are_rejected_then_the_corrected_call_runs(log: SqliteEventLog) -> None:
    booked: list[datetime.date] = []

    @tool
    def book_delivery(order_id: str, end_date: datetime.date) -> str:
        """Book a delivery before end_date."""
        booked.append(end_date)
        return f"{order_id} booked for {end_date.isoformat()}"

    def model_fn(request: ModelRequest) -> ModelResponse | str:
        results = tool_messages(request)
        if not results:
            return reply("", call("book_delivery", {"order_id": "A-1", "end_date": "2025/1/15"}, "bad"))
        if results[-1].content.startswith("[REJECTED]"):
            return reply("", call("book_delivery", {"order_id": "A-1", "end_date": "2025-01-15"}, "good"))
        return "Booked."

    model = FunctionModel(model_fn)
    h = await harness(log, model, [book_delivery])
    await h.send("Deliver A-1 by Jan 15")

    events = await h.events()
    rejected_batch = ["ToolCallFinished", "StateChanged", "SnapshotTaken"]  # never started
    assert types(events) == START + ask_tools(1) + rejected_batch + ask_tools(1) + run_tools(1) + ANSWER
    assert [s.call_id for s in of(events, ev.ToolCallStarted)] == ["good"]
    bad, good = of(events, ev.ToolCallFinished)
    assert (bad.call_id, bad.status, bad.attempts) == ("bad", "rejected", 0)
    assert "end_date must be YYYY-MM-DD, got '2025/1/15'" in bad.content
    assert (good.call_id, good.status, good.content) == ("good", "success", "A-1 booked for 2025-01-15")
    assert booked == [datetime.date(2025, 1, 15)], "the rejected call must not run"

    correction = tool_messages(model.requests[1])[-1]
    assert correction.tool_call_id == "bad"
    assert correction.content == (
        "[REJECTED] invalid arguments for book_delivery: end_date must be YYYY-MM-DD, got '2025/1/15'. "
        "Fix the arguments and call book_delivery again."
    )
    assert path(events)[1:3] == [
        ("PROCESSING", "TOOL_WAIT", "model_tool_call"),
        ("TOOL_WAIT", "PROCESSING", "tool_result"),
    ]


async def test_rejected_and_valid_calls_in_one_batch_keep_request_order(log: SqliteEventLog) -> None:
    def model_fn(request: ModelRequest) -> ModelResponse | str:
        if last_is_tool(request):
            return "done"
        return reply(
            "",
            call("get_weather", {"city": "Oslo"}, "ok1"),
            call("get_weather", {"town": "Rome"}, "bad"),
            call("get_weather", {"city": "Rome"}, "ok2"),
        )

    model = FunctionModel(model_fn)
    h = await harness(log, model, [get_weather])
    await h.send("Oslo and Rome?")

    events = await h.events()
    assert [(f.call_id, f.status) for f in of(events, ev.ToolCallFinished)] == [
        ("ok1", "success"),
        ("bad", "rejected"),
        ("ok2", "success"),
    ]
    assert [m.tool_call_id for m in tool_messages(model.requests[1])] == ["ok1", "bad", "ok2"]
    assert sorted(weather_calls) == ["Oslo", "Rome"]


async def test_unknown_tool_is_rejected_and_nothing_runs(log: SqliteEventLog) -> None:
    def model_fn(request: ModelRequest) -> ModelResponse | str:
        if last_is_tool(request):
            return "Sorry, I cannot do that."
        return reply("", call("launch_rocket", {"target": "moon"}, "r1"))

    model = FunctionModel(model_fn)
    h = await harness(log, model, [get_weather])
    await h.send("Launch!")

    events = await h.events()
    assert "ToolCallStarted" not in types(events)
    (finished,) = of(events, ev.ToolCallFinished)
    assert finished.status == "rejected"
    assert finished.content == "[REJECTED] no such tool 'launch_rocket'; available tools are: get_weather."
    assert weather_calls == []
    assert tool_messages(model.requests[1])[0].content == finished.content
    assert of(events, ev.TurnFinished)[0].reason == "answered"


async def test_tool_that_raises_is_reported_failed_and_the_model_still_answers(log: SqliteEventLog) -> None:
    @tool
    def check_stock(sku: str) -> int:
        """Stock level."""
        raise RuntimeError("warehouse offline")

    def model_fn(request: ModelRequest) -> ModelResponse | str:
        if last_is_tool(request):
            return "I could not check the stock right now."
        return reply("", call("check_stock", {"sku": "X1"}, "s1"))

    model = FunctionModel(model_fn)
    h = await harness(log, model, [check_stock])
    await h.send("Is X1 in stock?")

    events = await h.events()
    assert types(events) == START + ask_tools(1) + run_tools(1) + ANSWER
    (done,) = of(events, ev.ToolCallFinished)
    assert done.status == "failed" and done.content.startswith("[FAILED]")
    assert "RuntimeError: warehouse offline" in done.content and done.output_json is None
    assert len(model.requests) == 2 and tool_messages(model.requests[1])[0].content == done.content
    assert path(events)[-1] == ("PROCESSING", "FINISHED", "model_answer")


async def test_tool_that_times_out_is_reported_and_the_turn_continues(log: SqliteEventLog) -> None:
    @tool(timeout_s=0.05)
    async def send_invoice(order_id: str) -> str:
        """Email an invoice (not safe to repeat)."""
        await asyncio.Event().wait()
        return "sent"

    def model_fn(request: ModelRequest) -> ModelResponse | str:
        if last_is_tool(request):
            return "The invoice may not have been sent; please check."
        return reply("", call("send_invoice", {"order_id": "A-1"}, "i1"))

    model = FunctionModel(model_fn)
    h = await harness(log, model, [send_invoice])
    await h.send("Send the invoice")

    events = await h.events()
    assert types(events) == START + ask_tools(1) + run_tools(1) + ANSWER
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.attempts) == ("timeout", 1)
    assert done.content.startswith("[FAILED: TIMEOUT] send_invoice did not finish within 0.05 s")
    assert of(events, ev.TurnFinished)[0].reason == "answered"
    assert (await h.api.get_state(h.sid)).status == "FINISHED"


# --- the iteration cap --------------------------------------------------------------------------


def looping_model(text: str, per_step: int = 1) -> FunctionModel:
    """Asks for lookups forever, even when no tools are offered."""

    def fn(request: ModelRequest) -> ModelResponse:
        n = len(request.messages)
        calls = [call("get_weather", {"city": f"City{n}-{i}"}, f"c{n}-{i}") for i in range(per_step)]
        return reply(text, *calls)

    return FunctionModel(fn)


async def test_iteration_cap_forces_a_closing_answer_without_tools(log: SqliteEventLog) -> None:
    model = looping_model("Still checking the weather.")
    h = await harness(log, model, [get_weather], max_tool_iterations=3)
    await h.send("Weather everywhere?")

    events = await h.events()
    closing_answer = [
        "ModelCallStarted",
        "ModelCallFinished",
        "AssistantMessage",
        "StateChanged",
        "TurnFinished",
        "SnapshotTaken",
    ]
    guarded_last_step = [
        "ToolCallStarted",
        "ToolCallFinished",
        "LoopGuardTriggered",
        "StateChanged",
        "SnapshotTaken",
    ]
    assert types(events) == (
        START + (ask_tools(1) + run_tools(1)) * 2 + ask_tools(1) + guarded_last_step + closing_answer
    )
    (guard,) = of(events, ev.LoopGuardTriggered)
    assert (guard.guard, guard.reason) == ("iteration_cap", "the turn used its maximum of 3 tool steps")
    assert [e.iteration for e in of(events, ev.ToolCallRequested)] == [1, 2, 3]
    assert len(weather_calls) == 3
    assert len(model.requests) == 4
    assert all(list(r.tools) == [get_weather.spec()] for r in model.requests[:3])
    closing = model.requests[3]
    assert list(closing.tools) == []
    assert closing.messages[-1].role == "system"
    assert "maximum of 3 tool steps" in closing.messages[-1].content
    assert "Do not call any tool" in closing.messages[-1].content
    assert of(events, ev.ModelCallStarted)[-1].tools_offered == 0

    last = of(events, ev.AssistantMessage)[-1]
    assert (last.text, last.tool_calls) == ("Still checking the weather.", ()), (
        "tool calls after the cap are dropped"
    )
    assert path(events)[-1] == ("PROCESSING", "FINISHED", "guard")
    (finished,) = of(events, ev.TurnFinished)
    assert (finished.reason, finished.iterations, finished.model_calls) == ("iteration_cap", 3, 4)
    history = await h.history()
    assert history[-1] == ChatMessage("assistant", "Still checking the weather.")
    assert not any(m.role == "system" for m in history), "the closing note is not part of the conversation"


@pytest.mark.parametrize("per_step", [1, 2])
async def test_iteration_cap_with_no_closing_text_lists_what_was_gathered(
    log: SqliteEventLog, per_step: int
) -> None:
    model = looping_model("", per_step)
    h = await harness(log, model, [get_weather], max_tool_iterations=3)
    await h.send("Weather everywhere?")

    events = await h.events()
    results = of(events, ev.ToolCallFinished)
    assert len(results) == 3 * per_step
    answer = of(events, ev.AssistantMessage)[-1].text
    assert answer.startswith("I stopped to avoid a loop (the turn used its maximum of 3 tool steps)")
    listed = [line for line in answer.splitlines() if line.startswith("- ")]
    assert listed == [f"- get_weather: {r.content}" for r in results], "every result of the turn is listed"
    assert of(events, ev.TurnFinished)[0].reason == "iteration_cap"


async def test_iteration_cap_counts_per_turn(log: SqliteEventLog) -> None:
    def fn(request: ModelRequest) -> ModelResponse | str:
        since_user = (
            len(request.messages) - max(i for i, m in enumerate(request.messages) if m.role == "user") - 1
        )
        if since_user >= 4:  # two tool batches in this turn
            return "done"
        return reply("", call("get_weather", {"city": "Oslo"}, f"c{len(request.messages)}"))

    model = FunctionModel(fn)  # two batches a turn: under a cap of 3, unless turns shared one count
    h = await harness(log, model, [get_weather], max_tool_iterations=3)
    await h.send("first")
    await h.send("second")
    finished = of(await h.events(), ev.TurnFinished)
    assert [(f.reason, f.iterations) for f in finished] == [("answered", 2), ("answered", 2)]


# --- model failures -----------------------------------------------------------------------------


async def test_model_error_fails_the_turn_and_the_next_message_starts_a_new_one(log: SqliteEventLog) -> None:
    model = ScriptedModel([ModelError("provider returned 503"), "Back again."])
    h = await harness(log, model, system_prompt="S")
    await h.send("Hello?")

    events = await h.events()
    assert types(events) == START + [
        "ModelCallStarted",
        "ModelCallFinished",
        "StateChanged",
        "TurnFinished",
        "SnapshotTaken",
    ]
    (failed,) = of(events, ev.ModelCallFinished)
    assert (failed.status, failed.error) == ("failed", "ModelError: provider returned 503")
    assert path(events)[-1] == ("PROCESSING", "ERROR", "model_error")
    (finished,) = of(events, ev.TurnFinished)
    assert (finished.reason, finished.model_calls) == ("model_error", 1)
    assert of(events, ev.AssistantMessage) == []
    assert await h.history() == [ChatMessage.user("Hello?")]
    assert (await h.api.get_state(h.sid)).status == "ERROR"

    await h.send("Are you there?")
    events = await h.events()
    assert path(events)[-2:] == [
        ("ERROR", "PROCESSING", "user_message"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]
    assert [t.reason for t in of(events, ev.TurnFinished)] == ["model_error", "answered"]
    assert list(model.requests[1].messages) == [
        ChatMessage.system("S"),
        ChatMessage.user("Hello?"),
        ChatMessage.user("Are you there?"),
    ]


async def test_first_token_timeout_fails_the_call_naming_the_limit(log: SqliteEventLog) -> None:
    async def silent(request: ModelRequest) -> AsyncIterator[ModelChunk]:
        await asyncio.sleep(30)
        yield ModelResponse("too late")

    model = CountingModel(silent)
    h = await harness(log, model, first_token_timeout_s=0.05)
    await h.send("Hello?")

    events = await h.events()
    (failed,) = of(events, ev.ModelCallFinished)
    assert failed.status == "failed"
    assert failed.error == "ModelTimeoutError: model call exceeded its first-token limit of 0.05 s"
    assert path(events)[-1] == ("PROCESSING", "ERROR", "model_error")
    assert of(events, ev.TurnFinished)[0].reason == "model_error"
    assert of(events, ev.AssistantMessage) == []


async def test_total_response_timeout_names_its_limit(log: SqliteEventLog) -> None:
    async def stalls(request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("Let me think")
        await asyncio.sleep(30)
        yield ModelResponse("Let me think... done")

    h = await harness(log, CountingModel(stalls), first_token_timeout_s=5, model_timeout_s=0.1)
    streamed = await h.send("Hello?")
    (failed,) = of(await h.events(), ev.ModelCallFinished)
    assert failed.error == "ModelTimeoutError: model call exceeded its total-response limit of 0.1 s"
    assert [d.text for d in streamed if isinstance(d, ModelDelta)] == ["Let me think"]


async def test_stream_that_breaks_after_deltas_leaves_no_partial_message(log: SqliteEventLog) -> None:
    async def breaks(request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("Half an ")
        yield TextDelta("answer")
        raise ModelError("connection reset by peer")

    h = await harness(log, CountingModel(breaks))
    streamed = await h.send("Tell me everything")

    assert [d.text for d in streamed if isinstance(d, ModelDelta)] == ["Half an ", "answer"]
    events = await h.events()
    assert of(events, ev.AssistantMessage) == []
    (failed,) = of(events, ev.ModelCallFinished)
    assert failed.error == "ModelError: connection reset by peer"
    assert await h.history() == [ChatMessage.user("Tell me everything")]
    assert not any("Half an" in repr(e) for e in events)
    assert (await h.api.get_state(h.sid)).status == "ERROR"


async def test_stream_without_a_final_response_is_a_failed_call(log: SqliteEventLog) -> None:
    async def no_response(request: ModelRequest) -> AsyncIterator[ModelChunk]:
        yield TextDelta("Hmm")

    h = await harness(log, CountingModel(no_response))
    await h.send("?")
    (failed,) = of(await h.events(), ev.ModelCallFinished)
    assert failed.status == "failed" and "ended its stream without a complete message" in (failed.error or "")


# --- redelivery and queued messages -------------------------------------------------------------


async def test_redelivered_message_runs_no_second_turn(log: SqliteEventLog, reopen: Any) -> None:
    model = ScriptedModel(["Only once."])
    h = await harness(log, model)
    await h.send("Hello")
    version = await log.session_version(h.sid)

    assert await h.run_pending() == []  # the same API again

    other_runner = TurnRunner(log, h.api.agents.get, producer="worker-2")  # another runner, same log
    assert [item async for item in other_runner.run(h.sid)] == []

    async with reopen() as second_log:  # another process's connection to the log
        other = AgentSessions(second_log, h.api.agents, producer="worker-3")
        assert [item async for item in other.run_pending(h.sid)] == []

    assert await log.session_version(h.sid) == version
    assert len(model.requests) == 1
    assert len(of(await h.events(), ev.TurnStarted)) == 1


async def test_two_queued_messages_are_answered_in_order_by_two_turns(log: SqliteEventLog) -> None:
    model = FunctionModel(lambda r: f"answer to {r.messages[-1].content}")
    h = await harness(log, model, system_prompt="S")
    first = (await h.api.post_user_message(h.sid, "one")).event
    second = (await h.api.post_user_message(h.sid, "two")).event
    assert model.requests == []
    state = await h.api.get_state(h.sid)
    assert [m.text for m in state.inbox] == ["one", "two"] and state.status == "IDLE"

    await h.run_pending()

    events = await h.events()
    assert types(events) == [
        "SessionCreated",
        "UserMessageReceived",
        "UserMessageReceived",
        "TurnStarted",
        "StateChanged",
        *ANSWER,
        "TurnStarted",
        "StateChanged",
        *ANSWER,
    ]
    assert [t.message_id for t in of(events, ev.TurnStarted)] == [first.message_id, second.message_id]
    assert [[m.content for m in r.messages] for r in model.requests] == [
        ["S", "one"],
        ["S", "one", "answer to one", "two"],
    ]
    assert path(events) == [
        ("IDLE", "PROCESSING", "user_message"),
        ("PROCESSING", "FINISHED", "model_answer"),
        ("FINISHED", "PROCESSING", "user_message"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]
    assert [m.content for m in await h.history()] == ["one", "answer to one", "two", "answer to two"]


# --- input checks -------------------------------------------------------------------------------


async def test_message_too_large_is_refused_and_nothing_is_appended(log: SqliteEventLog) -> None:
    model = ScriptedModel(["ok"])
    h = await harness(log, model, max_message_bytes=10)
    version = await log.session_version(h.sid)
    with pytest.raises(MessageTooLargeError, match="message is 12 bytes; the limit is 10 bytes") as caught:
        await h.send("éééééé")  # 6 characters, 12 UTF-8 bytes
    assert (caught.value.size, caught.value.limit) == (12, 10)
    assert await log.session_version(h.sid) == version
    assert model.requests == []
    await h.send("ten bytes!")  # exactly at the limit is fine
    assert of(await h.events(), ev.TurnFinished)[0].reason == "answered"


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
async def test_empty_message_is_refused(log: SqliteEventLog, text: str) -> None:
    h = await harness(log, ScriptedModel([]))
    with pytest.raises(InputError, match="empty"):
        await h.api.post_user_message(h.sid, text)
    assert await log.session_version(h.sid) == 1


@pytest.mark.parametrize(
    "text, problem",
    [
        ("hi \ud800 there", r"a lone surrogate U\+D800 at position 3, which is not valid Unicode"),
        ("a\x00b", "a NUL character at position 1"),
    ],
)
async def test_text_the_log_cannot_hold_is_refused_for_every_api_caller(
    log: SqliteEventLog, text: str, problem: str
) -> None:
    h = await harness(log, ScriptedModel([]))
    with pytest.raises(InputError, match=problem):
        await h.api.post_user_message(h.sid, text)
    with pytest.raises(InputError, match=problem):
        await h.send(text)
    assert await log.session_version(h.sid) == 1


async def test_unknown_session_raises_not_found(log: SqliteEventLog) -> None:
    h = await harness(log, ScriptedModel([]))
    with pytest.raises(SessionNotFoundError, match="no session 'nope'"):
        await h.api.post_user_message("nope", "hi")
    assert await log.session_version("nope") == 0


# --- force_finish and invoke_tool ---------------------------------------------------------------


async def test_force_finish_with_a_queued_message_closes_the_session(log: SqliteEventLog) -> None:
    model = ScriptedModel(["never"])
    h = await harness(log, model)
    await h.api.post_user_message(h.sid, "pending")

    await h.api.force_finish(h.sid, "abuse report", actor="ops")

    events = await h.events()
    assert types(events) == [
        "SessionCreated",
        "UserMessageReceived",
        "StateChanged",
        "SessionClosed",
        "UserMessageDropped",  # accepted, never answered: the log says why
    ]
    assert path(events) == [("IDLE", "FINISHED", "admin")]
    (dropped,), (received,) = of(events, ev.UserMessageDropped), of(events, ev.UserMessageReceived)
    assert (dropped.message_id, dropped.reason) == (received.message_id, "closed")
    assert of(events, ev.StateChanged)[0].detail == "abuse report"
    (closed,) = of(events, ev.SessionClosed)
    assert (closed.reason, closed.actor) == ("abuse report", "ops")
    assert await h.run_pending() == [] and model.requests == []
    with pytest.raises(SessionClosedError, match="closed \\(abuse report\\)"):
        await h.api.post_user_message(h.sid, "hello?")
    with pytest.raises(SessionClosedError):
        await h.api.force_finish(h.sid, "again")
    assert types(await h.events())[-1] == "UserMessageDropped"


async def test_force_finish_after_an_answered_turn_only_closes(log: SqliteEventLog) -> None:
    h = await harness(log, ScriptedModel(["hi"]))
    await h.send("hello")
    await h.api.force_finish(h.sid, "done")
    events = await h.events()
    # already FINISHED: no self-transition
    assert types(events)[-3:] == ["TurnFinished", "SnapshotTaken", "SessionClosed"]
    state = await h.api.get_state(h.sid)
    assert state.closed and state.close_reason == "done" and state.status == "FINISHED"


async def test_force_finish_mid_turn_from_another_process(log: SqliteEventLog, reopen: Any) -> None:
    """On Kafka the other process owns no partition: the request goes through the inbox and
    the owner writes the close."""
    release = asyncio.Event()

    @tool(timeout_s=10)
    async def slow_export(table: str) -> str:
        """A long export."""
        await release.wait()
        return "exported"

    def model_fn(request: ModelRequest) -> ModelResponse | str:
        return "done" if last_is_tool(request) else reply("", call("slow_export", {"table": "orders"}, "x1"))

    model = FunctionModel(model_fn)
    h = await harness(log, model, [slow_export])
    worker = asyncio.create_task(h.send("export everything"))
    for _ in range(500):
        if "ToolCallStarted" in types(await h.events()):
            break
        await asyncio.sleep(0.01)
    else:
        worker.cancel()
        pytest.fail("the tool never started")

    async with reopen() as admin_log:
        admin = AgentSessions(admin_log, h.api.agents, producer="admin-cli")
        info = await admin.force_finish(h.sid, "stuck export")
        assert (info.status, info.version) == ("FINISHED", len(await admin_log.read_session(h.sid)))
        with pytest.raises(SessionClosedError):
            await admin.force_finish(h.sid, "again")
    release.set()
    # the worker's next append conflicts with the admin's; it sees the session closed and stops
    await asyncio.wait_for(worker, 10)

    events = await h.events()
    assert types(events)[-5:] == [
        "ToolCallStarted",
        "StateChanged",
        "TurnFinished",
        "SessionClosed",
        "SnapshotTaken",  # a forced turn end is snapshotted too, closed
    ]
    assert path(events)[-1] == ("TOOL_WAIT", "FINISHED", "admin")
    (finished,) = of(events, ev.TurnFinished)
    assert (finished.reason, finished.iterations, finished.model_calls) == ("forced", 1, 1)
    assert events[-1].producer == "admin-cli" and events[-1].status == "FINISHED"  # type: ignore[attr-defined]
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert await h.run_pending() == []  # the worker reloads and sees nothing to do
    with pytest.raises(SessionClosedError):
        await h.api.post_user_message(h.sid, "and now?")


async def test_invoke_tool_validates_runs_and_is_recorded_outside_the_conversation(
    log: SqliteEventLog,
) -> None:
    h = await harness(log, ScriptedModel([]), [get_weather])
    version = await log.session_version(h.sid)

    outcome = await h.api.invoke_tool(h.sid, "get_weather", {"city": "Lima"})
    assert (outcome.status, outcome.content) == (ToolStatus.SUCCESS, "sunny, 21°C in Lima")
    assert weather_calls == ["Lima"]

    bad = await h.api.invoke_tool(h.sid, "get_weather", {"city": 7})
    assert bad.status == ToolStatus.REJECTED and "city must be a string, got 7" in bad.content
    unknown = await h.api.invoke_tool(h.sid, "get_time", {})
    assert unknown.status == ToolStatus.REJECTED and "available tools are: get_weather" in unknown.content
    assert weather_calls == ["Lima"]
    invoked = (await h.events())[version:]
    assert [(e.type, e.tool_name, e.status, e.actor) for e in invoked] == [  # type: ignore[attr-defined]
        ("ToolInvoked", "get_weather", "success", "api"),
        ("ToolInvoked", "get_weather", "rejected", "api"),
        ("ToolInvoked", "get_time", "rejected", "api"),
    ]
    assert await h.history() == [], "direct invocations are not part of the conversation"


@pytest.mark.usefixtures("sqlite_only")  # reads the SQLite file directly
@pytest.mark.parametrize("idempotent", [False, True])
async def test_what_a_model_or_tool_acts_on_is_durable_before_it_acts(
    log: SqliteEventLog, log_path: Any, idempotent: bool
) -> None:
    """Read the log from a second connection at the moment of each side effect. A tool that is
    not idempotent runs only once its start is on disk; an idempotent one (run again if its
    worker dies) once the model call that asked for it is: its start is committed with its
    result."""
    seen: list[tuple[str, list[str]]] = []

    def on_disk() -> list[str]:
        with contextlib.closing(sqlite3.connect(log_path)) as db:
            return [str(codec.type_of(record)) for record in all_records(db)]

    @tool(idempotent=idempotent)
    async def lookup(order_id: str) -> str:
        """Look up an order."""
        seen.append(("tool", on_disk()))
        return f"{order_id}: delayed"

    def model_fn(request: ModelRequest) -> ModelResponse | str:
        seen.append(("model", on_disk()))
        done = len(tool_messages(request))
        return "all done" if done == 2 else reply("", call("lookup", {"order_id": f"A{done}"}, f"c{done}"))

    h = await harness(log, FunctionModel(model_fn), [lookup])
    await h.send("check two orders")

    kinds = [k for k, _ in seen]
    assert kinds == ["model", "tool", "model", "tool", "model"]
    assert seen[0][1][-4:] == ["UserMessageReceived", "TurnStarted", "StateChanged", "ModelCallStarted"]
    for kind, on_log in seen:
        if kind == "model":  # every earlier tool result and the call's own start are on disk
            assert on_log[-1] == "ModelCallStarted"
            assert on_log.count("ToolCallFinished") == on_log.count("ToolCallRequested")
        elif not idempotent:  # the model's request for the tool and the tool's start are on disk
            assert on_log[-1] == "ToolCallStarted" and on_log[-3:-1] == ["ToolCallRequested", "StateChanged"]
        else:  # the model call that asked for it is on disk; its answer and the start are not yet
            assert on_log[-1] == "ModelCallStarted"
            assert on_log.count("ToolCallStarted") == on_log.count("ToolCallFinished")
    events = await h.events()
    assert types(events)[-2:] == ["TurnFinished", "SnapshotTaken"]
    assert types(events).count("ToolCallStarted") == 2 == types(events).count("ToolCallFinished")


async def test_a_slow_idempotent_tool_is_seen_running_before_it_returns(log: SqliteEventLog) -> None:
    """An idempotent tool's start need not be committed before it runs, but one that is still
    running after START_NOTICE_S has its start on the log while it runs: a stream or an admin
    sees the tool running (a tool that waits for the user to see it would otherwise never end)."""
    holder: list[Harness] = []
    seen_while_running: list[list[str]] = []

    @tool(idempotent=True, timeout_s=60)
    async def wait_for_carrier(order_id: str) -> str:
        """Wait until the carrier answers."""
        async with asyncio.timeout(30):  # a bound: failing here means the start never showed
            while "ToolCallStarted" not in (on_log := types(await holder[0].events())):
                await asyncio.sleep(0.02)
        seen_while_running.append(on_log)
        return f"{order_id}: the carrier answered"

    def model_fn(request: ModelRequest) -> ModelResponse | str:
        if tool_messages(request):
            return "the carrier answered"
        return reply("", call("wait_for_carrier", {"order_id": "A1"}, "c1"))

    h = await harness(log, FunctionModel(model_fn), [wait_for_carrier])
    holder.append(h)
    await h.send("where is A1?")

    assert len(seen_while_running) == 1
    running = seen_while_running[0]
    assert running[-3:] == ["ToolCallRequested", "StateChanged", "ToolCallStarted"]
    assert "ToolCallFinished" not in running
    events = await h.events()
    assert types(events).count("ToolCallStarted") == 1 == types(events).count("ToolCallFinished")
    assert of(events, ev.TurnFinished)[-1].reason == "answered"


async def test_a_message_that_loses_a_race_with_another_producer_is_retried(log: SqliteEventLog) -> None:
    """Another producer appends to the session between our read and our first commit: our
    message is not lost, and the two are answered one after the other in log order."""
    answers = iter(["first answer", "second answer"])
    h = await harness(log, FunctionModel(lambda request: next(answers)))
    other = AgentSessions(log, h.api.agents, producer="other-gateway")
    real_append = log.append
    raced = False

    async def append_after_a_rival(
        events: Sequence[ev.Event], *, expected_version: int, redoable: bool = False
    ) -> Any:
        nonlocal raced
        if not raced:
            raced = True
            await other.post_user_message(h.sid, "the rival's message")
        return await real_append(events, expected_version=expected_version, redoable=redoable)

    log.append = append_after_a_rival  # type: ignore[method-assign]
    items = await h.send("my message")

    events = await h.events()
    received = [e.text for e in of(events, ev.UserMessageReceived)]
    assert received == ["the rival's message", "my message"]
    assert [e.producer for e in of(events, ev.UserMessageReceived)] == ["other-gateway", "api"]
    assert [m.content for m in await h.history()] == [
        "the rival's message",
        "first answer",
        "my message",
        "second answer",
    ]
    assert of(items, ev.UserMessageReceived)[0].text == "my message"
    assert [e.version for e in events] == list(range(1, len(events) + 1))
