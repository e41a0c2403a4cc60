"""Retry on the backup model, then degrade: against real HTTP servers that fail the way real APIs
do (500, 429 with Retry-After, a slow first byte, a stall mid-stream, a malformed chunk)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.openai_server import FakeError, FakeMalformed, FakeOpenAIServer, FakeReply, Step, serve_openai
from turnlog.engine import AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent, AgentDirectory
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.messages import ChatMessage
from turnlog.engine.models.degraded import DEGRADED_NOTICE, Intent, RuleBasedResponder
from turnlog.engine.models.fallback import FallbackModel, drop_oldest_exchange
from turnlog.engine.models.openai_compat import OpenAICompatibleModel
from turnlog.engine.models.scripted import call
from turnlog.engine.stream import ModelDelta
from turnlog.engine.tools.registry import tool


@tool(idempotent=True)
def order_status(order_id: str) -> str:
    """Where an order is."""
    return f"{order_id}: in transit, arriving tomorrow"


@contextlib.contextmanager
def two_servers(
    primary: list[Step], backup: list[Step]
) -> Iterator[tuple[FakeOpenAIServer, FakeOpenAIServer]]:
    with (
        serve_openai(primary, model="main-model") as first,
        serve_openai(backup, model="backup-model") as second,
    ):
        yield first, second


def _model(server: FakeOpenAIServer, name: str) -> OpenAICompatibleModel:
    return OpenAICompatibleModel(name, base_url=server.base_url, api_key="k")


async def _run(tmp_path: Path, model: FallbackModel, text: str) -> list[Any]:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    api = AgentSessions(log, AgentDirectory([Agent.build("a", model, [order_status])]))
    session = await api.create_session("a", "u")
    items = [item async for item in api.send_user_message(session.session_id, text)]
    await model.aclose()
    await log.close()
    return items


def _events(items: list[Any], kind: type[ev.Event]) -> list[Any]:
    return [i for i in items if isinstance(i, kind)]


@pytest.mark.parametrize(
    "failure, reason",
    [
        (FakeError(500, "upstream exploded"), "answered 500"),
        (FakeError(429, "slow down", retry_after="30"), "answered 429"),
        (FakeReply("late", delay_s=5.0), "first-token limit of 0.5 s"),
        (FakeReply("stalls", chunk_size=2, stall_after_chunks=3, stall_s=5.0), "total-response limit"),
        (FakeMalformed("half an answ"), "broke before the answer was complete"),
    ],
    ids=["500", "429", "slow-first-byte", "stall", "malformed-chunk"],
)  # fmt: skip
async def test_a_failed_call_is_retried_once_on_the_backup(
    tmp_path: Path, failure: Step, reason: str
) -> None:
    with two_servers([failure], [FakeReply("Backup here.", usage=(10, 3))]) as (main, backup):
        chain = FallbackModel(
            _model(main, "main-model"), _model(backup, "backup-model"), first_token_s=0.5, response_s=1.5
        )
        items = await _run(tmp_path, chain, "hello")
    [switch] = _events(items, ev.ModelFallback)
    assert (switch.from_model, switch.to_model, switch.degraded) == ("main-model", "backup-model", False)
    assert reason in switch.reason
    [finished] = _events(items, ev.ModelCallFinished)
    assert (finished.status, finished.model, finished.retries) == ("ok", "backup-model", 1)
    assert _events(items, ev.AssistantMessage)[-1].text == "Backup here."
    assert len(main.requests) == 1 and len(backup.requests) == 1  # never the same model twice


async def test_when_both_fail_the_rule_based_responder_answers_and_says_so(tmp_path: Path) -> None:
    rules = RuleBasedResponder(
        [
            Intent(
                r"where is (my )?order",
                "Here is the latest status:",
                tool="order_status",
                arguments={"order_id": "O-7"},
            )
        ]
    )
    with two_servers([FakeError(503, "overloaded")], [FakeError(500, "down too")]) as (main, backup):
        chain = FallbackModel(_model(main, "main-model"), _model(backup, "backup-model"), rules)
        items = await _run(tmp_path, chain, "Where is my order O-7?")
    switches = _events(items, ev.ModelFallback)
    # both model steps (the tool call, then the answer) try the primary and the backup first
    assert [(s.to_model, s.degraded) for s in switches] == [
        ("backup-model", False),
        ("degraded-rules", True),
    ] * 2
    requested = _events(items, ev.ToolCallRequested)
    assert [(r.tool_name, json.loads(r.arguments_json)) for r in requested] == [
        ("order_status", {"order_id": "O-7"})
    ]
    answer = _events(items, ev.AssistantMessage)[-1].text
    assert answer.startswith(DEGRADED_NOTICE) and "O-7: in transit" in answer
    streamed = "".join(i.text for i in items if isinstance(i, ModelDelta))
    assert DEGRADED_NOTICE in streamed  # the user is told, live
    assert _events(items, ev.TurnFinished)[-1].reason == "answered"
    assert len(main.requests) == 2 and len(backup.requests) == 2


async def test_an_unrecognised_request_gets_the_degraded_default(tmp_path: Path) -> None:
    with two_servers([FakeError(500, "x")], [FakeError(500, "y")]) as (main, backup):
        chain = FallbackModel(
            _model(main, "main-model"), _model(backup, "backup-model"), RuleBasedResponder()
        )
        items = await _run(tmp_path, chain, "Write me a poem")
    answer = _events(items, ev.AssistantMessage)[-1].text
    assert DEGRADED_NOTICE in answer and "try again in a few minutes" in answer


async def test_without_a_degraded_responder_a_double_failure_fails_the_turn(tmp_path: Path) -> None:
    with two_servers([FakeError(500, "x")], [FakeError(500, "y")]) as (main, backup):
        chain = FallbackModel(_model(main, "main-model"), _model(backup, "backup-model"))
        items = await _run(tmp_path, chain, "hello")
    [finished] = _events(items, ev.ModelCallFinished)
    assert (finished.status, finished.retries) == ("failed", 1)
    assert "answered 500" in (finished.error or "")
    assert _events(items, ev.TurnFinished)[-1].reason == "model_error"


def test_the_backup_must_be_another_model() -> None:
    with serve_openai([]) as server, pytest.raises(ConfigurationError, match="must differ"):
        FallbackModel(_model(server, "same"), _model(server, "same"))


async def test_a_smaller_backup_window_gets_a_refitted_request(tmp_path: Path) -> None:
    history = []
    for n in range(12):
        history += [
            ChatMessage.user(f"question {n} " + "word " * 60),
            ChatMessage("assistant", "", (call("order_status", {"order_id": f"O-{n}"}, f"c{n}"),)),
            ChatMessage(
                "tool", f"O-{n}: in transit " + "detail " * 40, tool_call_id=f"c{n}", name="order_status"
            ),
            ChatMessage("assistant", f"answer {n}"),
        ]
    history.append(ChatMessage.user("and the last one?"))
    with two_servers([FakeError(500, "x")], [FakeReply("ok")]) as (main, backup):
        small = _model(backup, "backup-model")
        small.context_window = 2048
        chain = FallbackModel(_model(main, "main-model"), small)
        from turnlog.engine.models.base import ModelRequest

        request = ModelRequest([ChatMessage.system("Be brief."), *history])
        _ = [chunk async for chunk in chain.stream(request)]
        await chain.aclose()
    sent_to_main, sent_to_backup = main.requests[0]["messages"], backup.requests[0]["messages"]
    assert len(sent_to_main) == 1 + len(history)
    assert sent_to_backup[0] == {"role": "system", "content": "Be brief."}
    assert sent_to_backup[-1]["content"] == "and the last one?"
    assert 1 < len(sent_to_backup) < len(sent_to_main)
    # whole exchanges went: every tool result that was sent still has its call
    calls = {c["id"] for m in sent_to_backup for c in m.get("tool_calls") or ()}
    assert all(m["tool_call_id"] in calls for m in sent_to_backup if m["role"] == "tool")


def test_dropping_an_exchange_keeps_calls_with_their_results() -> None:
    messages = [
        ChatMessage.system("s"),
        ChatMessage.user("one"),
        ChatMessage("assistant", "", (call("t", {}, "c1"),)),
        ChatMessage("tool", "r1", tool_call_id="c1", name="t"),
        ChatMessage.user("two"),
    ]
    assert drop_oldest_exchange(messages) == [messages[0], messages[4]]
    assert drop_oldest_exchange([messages[0], messages[4]]) is None
