"""Tool calling through the prompt: the tolerant parser on a corpus of real shapes, and the
PromptToolsModel wrapper end to end through the openai SDK against a real HTTP server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.openai_server import FakeReply, serve_openai
from turnlog.engine import AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent, AgentDirectory
from turnlog.engine.errors import ModelError
from turnlog.engine.messages import ChatMessage
from turnlog.engine.models.base import ModelRequest, ModelResponse, TextDelta
from turnlog.engine.models.openai_compat import OpenAICompatibleModel
from turnlog.engine.models.prompt_tools import (
    ANSWER_STOPS,
    NEXT_STEP_HINT,
    NO_TOOLS_REQUEST,
    PromptToolsModel,
    to_text_messages,
)
from turnlog.engine.models.tool_text import parse_tool_text
from turnlog.engine.stream import ModelDelta
from turnlog.engine.tools.registry import tool

CORPUS = json.loads((Path(__file__).parent / "corpus" / "tool_call_texts.json").read_text())
TOOLS = ["query_orders", "send_notification", "save_report", "a_tool", "b_tool"]
ORDERS_TOOL = {
    "name": "query_orders",
    "description": "Find orders.",
    "parameters": {"type": "object", "properties": {"anomalies_only": {"type": "boolean"}}},
}


@pytest.mark.parametrize("case", CORPUS, ids=[c["shape"] for c in CORPUS])
def test_parser_reads_each_shape_of_the_corpus(case: dict[str, Any]) -> None:
    parsed = parse_tool_text(case["text"], TOOLS)
    assert [(c.name, json.loads(c.arguments_json)) for c in parsed.calls] == [tuple(c) for c in case["calls"]]
    assert parsed.repaired is case["repaired"]
    if "error" in case:
        assert parsed.error is not None and case["error"] in parsed.error
    else:
        assert parsed.error is None
        assert parsed.text == case["prose"]


def test_parser_gives_each_call_its_own_id() -> None:
    parsed = parse_tool_text(CORPUS[8]["text"], TOOLS)
    assert len({c.call_id for c in parsed.calls}) == 2


def test_unrepairable_error_names_the_position_and_shows_the_text() -> None:
    parsed = parse_tool_text('```json\n{"name": "query_orders", "arguments": {"x": 1 2}}\n```', TOOLS)
    assert parsed.error is not None
    assert "at character" in parsed.error and '"x": 1 2' in parsed.error


def test_history_is_written_as_text_the_model_can_follow() -> None:
    from turnlog.engine.models.scripted import call

    history = [
        ChatMessage.system("Be brief."),
        ChatMessage.user("check orders"),
        ChatMessage("assistant", "", (call("query_orders", {"anomalies_only": True}, "c1"),)),
        ChatMessage("tool", "Found 2 orders", tool_call_id="c1", name="query_orders"),
    ]
    sent = to_text_messages(history, [ORDERS_TOOL])
    assert [m.role for m in sent] == ["system", "user", "assistant", "user"]
    assert (
        sent[0].content.startswith("Be brief.")
        and "- query_orders(anomalies_only?: boolean): Find orders." in sent[0].content
    )
    assert '```json\n{"name": "query_orders", "arguments": {"anomalies_only": true}}\n```' == sent[2].content
    assert sent[3].content == "Tool result of query_orders (call c1):\nFound 2 orders" + NEXT_STEP_HINT
    assert all(not m.tool_calls for m in sent)


async def _collect(model: PromptToolsModel, request: ModelRequest) -> tuple[str, ModelResponse]:
    streamed, response = "", None
    async for chunk in model.stream(request):
        if isinstance(chunk, TextDelta):
            streamed += chunk.text
        else:
            response = chunk
    assert response is not None
    return streamed, response


def _ask(*tools: dict[str, Any]) -> ModelRequest:
    return ModelRequest([ChatMessage.system("Be brief."), ChatMessage.user("Any late orders?")], tools)


async def test_tool_call_json_is_never_streamed_and_becomes_a_call() -> None:
    text = 'Let me check.\n```json\n{"name": "query_orders", "arguments": {"anomalies_only": true}}\n```'
    with serve_openai([FakeReply(text, chunk_size=3)]) as server:
        model = PromptToolsModel(OpenAICompatibleModel("fake-model", base_url=server.base_url))
        streamed, response = await _collect(model, _ask(ORDERS_TOOL))
        await model.aclose()
    assert streamed == "Let me check.\n"
    assert response.text == "Let me check."
    assert [(c.name, json.loads(c.arguments_json)) for c in response.tool_calls] == [
        ("query_orders", {"anomalies_only": True})
    ]
    assert response.finish_reason == "tool_calls"
    sent = server.requests[0]
    assert "tools" not in sent  # the endpoint never sees native tool definitions
    assert "query_orders" in sent["messages"][0]["content"]


async def test_plain_answer_streams_whole_even_with_a_brace_in_it() -> None:
    text = "Two orders are late: O-1 {delayed} and O-2."
    with serve_openai([FakeReply(text, chunk_size=2)]) as server:
        model = PromptToolsModel(OpenAICompatibleModel("fake-model", base_url=server.base_url))
        streamed, response = await _collect(model, _ask(ORDERS_TOOL))
        await model.aclose()
    assert streamed == text and response.text == text and response.tool_calls == ()


async def test_unreadable_call_goes_back_to_the_model_with_the_error() -> None:
    broken = '```json\n{"name": "query_orders", "arguments": {"anomalies_only": yes please}}\n```'
    fixed = '```json\n{"name": "query_orders", "arguments": {"anomalies_only": true}}\n```'
    with serve_openai([FakeReply(broken, usage=(50, 10)), FakeReply(fixed, usage=(70, 9))]) as server:
        model = PromptToolsModel(OpenAICompatibleModel("fake-model", base_url=server.base_url))
        streamed, response = await _collect(model, _ask(ORDERS_TOOL))
        await model.aclose()
    assert streamed == ""
    assert [c.name for c in response.tool_calls] == ["query_orders"]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (120, 19)
    retry = server.requests[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": broken}
    assert retry[-1]["role"] == "user" and "could not be read: invalid JSON" in retry[-1]["content"]


async def test_a_model_that_never_writes_a_readable_call_fails_clearly() -> None:
    broken = '```json\n{"name": "query_orders", "arguments": {oops}\n```'
    with serve_openai([FakeReply(broken)] * 3) as server:
        model = PromptToolsModel(OpenAICompatibleModel("fake-model", base_url=server.base_url))
        with pytest.raises(ModelError, match="could not be read after 2 repair requests"):
            await _collect(model, _ask(ORDERS_TOOL))
        await model.aclose()
    assert len(server.requests) == 3


async def test_same_agent_runs_unchanged_on_a_model_without_native_tools(tmp_path: Path) -> None:
    calls: list[bool] = []

    @tool(idempotent=True)
    def query_orders(anomalies_only: bool = False) -> str:
        """Find orders."""
        calls.append(anomalies_only)
        return "O-1 delayed"

    script = [
        FakeReply(
            '<tool_call>\n{"name": "query_orders", "arguments": {"anomalies_only": true,}}\n</tool_call>'
        ),
        FakeReply("One order is late: O-1."),
    ]
    with serve_openai(script) as server:
        model = PromptToolsModel(OpenAICompatibleModel("fake-model", base_url=server.base_url))
        log = SqliteEventLog(tmp_path / "log.db", partitions=1)
        api = AgentSessions(log, AgentDirectory([Agent.build("a", model, [query_orders])]))
        session = await api.create_session("a", "u")
        items = [i async for i in api.send_user_message(session.session_id, "Any late orders?")]
        await model.aclose()
        await log.close()
    assert calls == [True]
    events = [i for i in items if isinstance(i, ev.Event)]
    requested = [e for e in events if isinstance(e, ev.ToolCallRequested)]
    assert [(e.tool_name, json.loads(e.arguments_json)) for e in requested] == [
        ("query_orders", {"anomalies_only": True})
    ]
    assert "".join(i.text for i in items if isinstance(i, ModelDelta)) == "One order is late: O-1."
    second = server.requests[1]["messages"]
    assert second[-1]["content"].startswith("Tool result of query_orders")
    assert [e.reason for e in events if isinstance(e, ev.TurnFinished)] == ["answered"]


async def test_a_call_written_when_no_tools_are_offered_is_held_back_and_asked_again() -> None:
    """The closing call of a capped turn offers no tools; a small model may still write one."""
    from turnlog.engine.models.scripted import call

    history = [
        ChatMessage.system("Be brief."),
        ChatMessage.user("check orders"),
        ChatMessage("assistant", "", (call("query_orders", {}, "c1"),)),
        ChatMessage("tool", "Found 2 orders", tool_call_id="c1", name="query_orders"),
        ChatMessage.system("Answer now without tools."),
    ]
    again = '```json\n{"name": "query_orders", "arguments": {}}\n```'
    with serve_openai([FakeReply(again, chunk_size=4), FakeReply("There are 2 orders.")]) as server:
        model = PromptToolsModel(OpenAICompatibleModel("fake-model", base_url=server.base_url))
        streamed, response = await _collect(model, ModelRequest(history))
        await model.aclose()
    assert streamed == "There are 2 orders." and response.text == "There are 2 orders."
    assert response.tool_calls == ()
    first, second = server.requests[0]["messages"], server.requests[1]["messages"]
    assert first[-1]["content"].endswith("Found 2 orders\n\nAnswer now without tools.")  # the note stays last
    assert second[-1] == {"role": "user", "content": NO_TOOLS_REQUEST}


async def test_repeating_the_call_that_just_succeeded_is_turned_into_a_request_to_answer() -> None:
    from turnlog.engine.models.base import ModelCorrection
    from turnlog.engine.models.prompt_tools import REPEAT_REQUEST
    from turnlog.engine.models.scripted import call

    history = [
        ChatMessage.user("save the report"),
        ChatMessage("assistant", "", (call("save_report", {"title": "T"}, "c1"),)),
        ChatMessage("tool", "Report saved.", tool_call_id="c1", name="save_report"),
    ]
    again = '```json\n{"name": "save_report", "arguments": {"title": "T"}}\n```'
    save = {"name": "save_report", "description": "Save.", "parameters": {"type": "object"}}
    with serve_openai([FakeReply(again), FakeReply("The report is saved.")]) as server:
        model = PromptToolsModel(OpenAICompatibleModel("fake-model", base_url=server.base_url))
        chunks = [c async for c in model.stream(ModelRequest(history, [save]))]
        await model.aclose()
    response = chunks[-1]
    assert isinstance(response, ModelResponse)
    assert response.tool_calls == () and response.text == "The report is saved."
    told = REPEAT_REQUEST.format(calls='{"name": "save_report", "arguments": {"title": "T"}}')
    assert server.requests[1]["messages"][-1] == {"role": "user", "content": told}
    [correction] = [c for c in chunks if isinstance(c, ModelCorrection)]
    assert (correction.attempt, correction.kind, correction.correction) == (1, "repeated_call", told)
    assert [c.name for c in correction.dropped] == ["save_report"]


async def test_a_model_that_insists_on_a_call_when_none_is_offered_never_streams_it() -> None:
    """Without tools the call openers are stop texts: the server ends the answer before the call."""
    history = [
        ChatMessage.user("check orders"),
        ChatMessage("tool", "Found 2 orders", tool_call_id="c1", name="query_orders"),
    ]
    again = 'Sure.\n```json\n{"name": "query_orders", "arguments": {}}\n```'
    with serve_openai([FakeReply(again, chunk_size=4)]) as server:
        inner = OpenAICompatibleModel("fake-model", base_url=server.base_url, max_tokens=512)
        model = PromptToolsModel(inner, answer_tokens=64)
        streamed, response = await _collect(model, ModelRequest(history))
        await model.aclose()
    assert response.tool_calls == () and response.text == "Sure.\n"
    assert "```" not in streamed and '"arguments"' not in streamed
    assert server.requests[0]["stop"] == list(ANSWER_STOPS) and len(server.requests) == 1
    assert server.requests[0]["max_tokens"] == 64  # a text answer is capped tighter than a call
