"""Corrections a model given tools through its prompt gets (PromptToolsModel), end to end through the
turn loop on a real log (both backends): a call the model repeats is never run twice whatever the
attempt, every correction is a ModelCorrected event in the step's commit, a text answer cannot loop
on tool calls, and each step's prompt starts with the previous step's (the server's prompt cache).

The inner model is a FunctionModel that reads the text the wrapper sends, as a small model would,
and honours the stop texts as a server does."""

from __future__ import annotations

import json
from typing import Any, Callable

from tests.tool_harness import of
from turnlog.engine import Agent, AgentDirectory, AgentSessions, FunctionModel, ModelRequest, tool
from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog
from turnlog.engine.models.prompt_text import ANSWER_NOW_REQUEST, ANSWER_STOPS, NO_TOOLS_REQUEST
from turnlog.engine.models.prompt_tools import PromptToolsModel
from turnlog.engine.tools import Tool


def block(*calls: tuple[str, dict[str, Any]]) -> str:
    lines = [json.dumps({"name": name, "arguments": arguments}) for name, arguments in calls]
    return "```json\n" + "\n".join(lines) + "\n```"


def last_user(request: ModelRequest) -> str:
    return next(m.content for m in reversed(request.messages) if m.role == "user")


class Office:
    """Side effects to count: notices sent and reports saved."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.saved: list[str] = []

    def tools(self) -> list[Tool]:
        @tool
        def notify(customer: str) -> str:
            """Send one customer a notice (not idempotent)."""
            self.sent.append(customer)
            return f"notice sent to {customer}"

        @tool
        def save_report(title: str) -> str:
            """Save the report (not idempotent)."""
            self.saved.append(title)
            return f"report {title!r} saved"

        return [notify, save_report]


async def run_turn(
    log: EventLog, office: Office, answer: Callable[[ModelRequest], str], **options: Any
) -> tuple[FunctionModel, list[ev.Event]]:
    inner = FunctionModel(answer, name="small-model")
    agent = Agent("clerk", PromptToolsModel(inner), office.tools(), **options)
    api = AgentSessions(log, AgentDirectory([agent]))
    session = await api.create_session("clerk", "user-1")
    items = [
        i async for i in api.send_user_message(session.session_id, "Notify C-1 and C-2, then save a report.")
    ]
    assert [e.type for e in of(items, ev.TurnFinished)] == ["TurnFinished"]
    return inner, await log.read_session(session.session_id)


async def test_a_repeated_call_is_never_run_again_whatever_the_attempt(log: EventLog) -> None:
    """The issue's bug: corrected twice, the third attempt's duplicate save_report used to run."""
    office = Office()

    def stubborn(request: ModelRequest) -> str:
        return block(("save_report", {"title": "weekly"}))  # whatever it is told, it saves (again)

    inner, events = await run_turn(log, office, stubborn)

    assert office.saved == ["weekly"]  # ran once, in the first step; never again
    corrections = of(events, ev.ModelCorrected)
    assert [(c.step, c.attempt, c.kind) for c in corrections] == [
        (1, 1, "repeated_call"),
        (1, 2, "repeated_call"),
    ]
    assert "already made in this request" in corrections[0].correction
    assert corrections[1].correction == ANSWER_NOW_REQUEST
    for c in corrections:
        assert json.loads(c.dropped_calls_json) == [{"name": "save_report", "arguments": {"title": "weekly"}}]
        assert '"save_report"' in c.model_text
    # what the model was sent: the corrections, and for the last attempt the call openers as stop texts
    step_two = inner.requests[1:]
    assert [last_user(r) for r in step_two[1:]] == [corrections[0].correction, ANSWER_NOW_REQUEST]
    assert [r.stop for r in step_two] == [(), (), ANSWER_STOPS]
    # the corrections are in the step's commit, before its ModelCallFinished
    finished = next(e for e in of(events, ev.ModelCallFinished) if e.step == 1)
    assert all(c.version < finished.version for c in corrections)
    [turn] = of(events, ev.TurnFinished)
    assert turn.reason == "no_answer"  # the model never wrote an answer: the engine answered
    answer = of(events, ev.AssistantMessage)[-1]
    assert answer.tool_calls == () and "report 'weekly' saved" in answer.text and "```" not in answer.text
    assert len(of(events, ev.ToolCallRequested)) == 1


async def test_repeats_that_come_with_new_calls_are_dropped_and_the_new_calls_run(log: EventLog) -> None:
    office = Office()

    def model(request: ModelRequest) -> str:
        told = _rendered(request)
        if "Tool result of" not in told:
            return block(("notify", {"customer": "C-1"}))
        if "notice sent to  c-2" not in told:  # C-1 again, C-2 twice: only one C-2 may go out
            return block(
                ("notify", {"customer": "C-1"}),
                ("notify", {"customer": " c-2"}),
                ("notify", {"customer": "C-2"}),
            )
        if "saved" not in told:
            return block(("save_report", {"title": "done"}))
        return "Both customers were notified and the report is saved."

    _, events = await run_turn(log, office, model)

    assert office.sent == ["C-1", " c-2"] and office.saved == ["done"]  # " c-2" is near-equal to "C-2"
    [correction] = of(events, ev.ModelCorrected)
    assert (correction.step, correction.kind, correction.correction) == (1, "repeated_call", "")
    assert [c["arguments"]["customer"] for c in json.loads(correction.dropped_calls_json)] == ["C-1", "C-2"]
    assert of(events, ev.TurnFinished)[0].reason == "answered"


async def test_a_model_told_it_repeated_itself_goes_on_and_answers(log: EventLog) -> None:
    office = Office()

    def model(request: ModelRequest) -> str:
        told = last_user(request)
        if told.startswith("These calls were already made"):
            return "The report is saved."
        return block(("save_report", {"title": "t"}))  # at first, and once more after its result

    inner, events = await run_turn(log, office, model)

    assert office.saved == ["t"]
    assert [c.kind for c in of(events, ev.ModelCorrected)] == ["repeated_call"]
    assert of(events, ev.TurnFinished)[0].reason == "answered"
    assert of(events, ev.AssistantMessage)[-1].text == "The report is saved."


async def test_an_unreadable_call_is_sent_back_with_the_error_and_recorded(log: EventLog) -> None:
    office = Office()

    def model(request: ModelRequest) -> str:
        told = last_user(request)
        if told.startswith("Your tool call could not be read"):
            return block(("notify", {"customer": "C-1"}))
        if "Tool result of" in told:
            return "C-1 was notified."
        return '```json\n{"name": "notify", "arguments": {"customer": C-1 please}}\n```'

    _, events = await run_turn(log, office, model)

    assert office.sent == ["C-1"]
    [correction] = of(events, ev.ModelCorrected)
    assert correction.kind == "unreadable_call" and "invalid JSON" in correction.correction
    assert "C-1 please" in correction.model_text and correction.dropped_calls_json == "[]"


async def test_the_closing_call_cannot_loop_and_keeps_the_prompt_prefix(log: EventLog) -> None:
    """A capped turn's last call offers no tools; the model writes a call anyway: the stop texts
    end it, it is asked once for text, and its prompt starts like every step before."""
    office = Office()

    def model(request: ModelRequest) -> str:
        told = last_user(request)
        if told == NO_TOOLS_REQUEST:
            return "I notified C-1; C-2 was not notified because the run was cut short."
        return block(("notify", {"customer": f"C-{told.count('notice sent') + 1}"}))

    inner, events = await run_turn(log, office, model, max_tool_iterations=1)

    assert office.sent == ["C-1"]
    [correction] = of(events, ev.ModelCorrected)
    assert (correction.step, correction.kind, correction.correction) == (
        1,
        "call_without_tools",
        NO_TOOLS_REQUEST,
    )
    [turn] = of(events, ev.TurnFinished)
    assert turn.reason == "iteration_cap"
    assert of(events, ev.AssistantMessage)[-1].text.startswith("I notified C-1;")
    first, closing, retry = inner.requests
    assert closing.stop == retry.stop == ANSWER_STOPS
    assert closing.messages[0] == first.messages[0]  # the same system prompt, tools described


async def test_each_step_prompt_starts_with_the_previous_step_prompt(log: EventLog) -> None:
    office = Office()

    def model(request: ModelRequest) -> str:
        told = last_user(request)
        if "Tool result of" not in told:
            return block(("notify", {"customer": "C-1"}), ("notify", {"customer": "C-2"}))
        if "saved" not in told:
            return block(("save_report", {"title": "weekly"}))
        return "Done: two notices sent, report saved."

    inner, events = await run_turn(log, office, model)

    assert of(events, ev.TurnFinished)[0].reason == "answered" and office.sent == ["C-1", "C-2"]
    texts = [_rendered(r) for r in inner.requests]
    assert len(texts) == 3
    for before, after in zip(texts, texts[1:], strict=False):
        assert after.startswith(before), "a step's prompt must extend the previous one (prompt cache)"
    # and the calls the model wrote come back as it wrote them, so the cache covers them too
    written = block(("notify", {"customer": "C-1"}), ("notify", {"customer": "C-2"}))
    assert texts[1].startswith(texts[0]) and f"<assistant>{written}<user>" in texts[1]


def _rendered(request: ModelRequest) -> str:
    """The request as a chat template lays it out: role markers and contents in order."""
    return "".join(f"<{m.role}>{m.content}" for m in request.messages)


async def test_calls_of_a_second_tool_wait_for_the_first_tools_results(log: EventLog) -> None:
    """A small model writes the notices and the report before it has looked anything up: reading
    stops where the second tool's call begins, only the first tool's calls run, and it calls the
    rest again, with real values, once it has the results."""
    office = Office()

    def eager(request: ModelRequest) -> str:
        told = last_user(request)
        if "Tool result of" not in told:  # everything at once, with made-up values
            return block(
                ("notify", {"customer": "C-1"}),
                ("notify", {"customer": "C-2"}),
                ("save_report", {"title": "guess"}),
                ("notify", {"customer": "C-9"}),
            )
        if "saved" not in told:
            return block(("save_report", {"title": "weekly"}))
        return "C-1 and C-2 were notified; the report is saved."

    inner, events = await run_turn(log, office, eager)

    assert office.sent == ["C-1", "C-2"] and office.saved == ["weekly"]
    [deferred] = of(events, ev.ModelCorrected)
    assert (deferred.step, deferred.kind, deferred.correction) == (0, "other_tools", "")
    assert [c["arguments"] for c in json.loads(deferred.dropped_calls_json)] == [
        {"title": "guess"},
        {"customer": "C-9"},
    ]
    assert '"save_report"' in deferred.model_text and "C-9" in deferred.model_text
    first = of(events, ev.AssistantMessage)[0]
    assert [c.name for c in first.tool_calls] == ["notify", "notify"]  # what the history says it asked
    step_zero = of(events, ev.ModelCallFinished)[0]
    assert step_zero.finish_reason == "tool_calls" and step_zero.output_tokens > 0  # counted: no usage came
    assert of(events, ev.TurnFinished)[0].reason == "answered"


async def test_an_argument_called_name_is_not_taken_for_a_second_tool(log: EventLog) -> None:
    office = Office()

    @tool
    def register(name: str, email: str) -> str:
        """Register a customer."""
        return f"registered {name}"

    inner = FunctionModel(
        lambda r: (
            block(("register", {"name": "notify", "email": "a@example.com"}))
            if "Tool result of" not in last_user(r)
            else "Registered."
        ),
        name="small-model",
    )
    agent = Agent("clerk", PromptToolsModel(inner), [*office.tools(), register])
    api = AgentSessions(log, AgentDirectory([agent]))
    session = await api.create_session("clerk", "user-1")
    _ = [i async for i in api.send_user_message(session.session_id, "Register the customer called notify.")]
    events = await log.read_session(session.session_id)
    [call] = of(events, ev.ToolCallRequested)
    assert json.loads(call.arguments_json) == {"name": "notify", "email": "a@example.com"}
    assert of(events, ev.ModelCorrected) == []
