"""Context management (issue 8) on a real SQLite log: budgets per section, trims and summaries
as events, archive recall, task state, verbatim-turn limits, the provider's context-length error.

Facts are planted in a 200-turn session and probed after many compactions: each probe must find
its fact in what the model is sent, or through the recall tool's answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from tests import tool_harness
from tests.context_support import last_user_text, open_session, provider_problems, section_tokens
from turnlog.engine import ContextPolicy, FunctionModel, ToolFailure, call, reply, tool
from turnlog.engine import events as ev
from turnlog.engine.budget import Budget
from turnlog.engine.context.assemble import RECALL_HEADER
from turnlog.engine.context.compaction import is_small_talk
from turnlog.engine.context.summarize import FALLBACK_NOTE
from turnlog.engine.fold import fold
from turnlog.engine.log.base import EventLog
from turnlog.engine.models.base import ModelRequest, ModelResponse
from turnlog.engine.models.pricing import PriceTable
from turnlog.engine.models.tokens import count_chat_tokens
from turnlog.engine.turn import TurnRunner

FACTS = [  # (planted by the user, a probe question or None, what the probe must find)
    (f["plant"], f["probe"], f["expect"])
    for f in json.loads((Path(__file__).parent / "corpus" / "context_facts.json").read_text(encoding="utf-8"))
]
PROBES = {probe: expected for _, probe, expected in FACTS if probe}
FILLER = "Continue with the next batch of the delivery list."
ANSWER = (
    "Checked the next batch of deliveries; nothing unusual, all parcels are on their way as planned. " * 2
)


@tool(idempotent=True)
def check_order(order_id: str) -> dict[str, str]:
    """Look up an order's delivery status."""
    if not order_id.startswith("A-"):
        raise ToolFailure(f"no order {order_id!r}; order ids look like A-12345")
    return {"order_id": order_id, "status": "delivered late"}


def rule_model(request: ModelRequest) -> ModelResponse | str:
    last = request.messages[-1]
    if last.role == "tool":
        if last.name == "check_order" and last.content.startswith("[FAILED"):
            return reply("", call("check_order", {"order_id": "A-" + last.content.split("'")[1]}))
        return "Done: " + last.content[:120]
    text = last_user_text(request)
    if text in PROBES:
        return reply("", call("recall_history", {"query": text}))
    if text.startswith("Check order "):
        return reply("", call("check_order", {"order_id": text.removeprefix("Check order A-")}))
    if is_small_talk(text):
        return "You're welcome."
    return ANSWER


def script() -> list[str]:
    """200 turns: filler, small talk, tool turns with a corrected error, and the facts."""
    turns: list[str] = []
    planted = iter(FACTS)
    for i in range(180):
        if i % 9 == 4:
            turns.append(next(planted)[0] if i // 9 < len(FACTS) else FILLER)
        elif i % 9 == 7:
            turns.append("thanks!")
        elif i % 9 == 8:
            turns.append(f"Check order A-{10000 + i}")
        else:
            turns.append(FILLER)
    turns += [f for f, _, _ in FACTS if f not in turns]
    return (turns + [FILLER] * 200)[:200]


async def test_facts_planted_over_200_turns_are_found_after_compaction(tmp_path: Path) -> None:
    policy = ContextPolicy(window=4096, summarizer="extractive")
    s = await open_session(tmp_path, rule_model, [check_order], context=policy)
    budget = policy.budgets(s.agent.model).history
    for text in script():
        await s.send(text)

    found, missed = 0, []
    for probe, expected in PROBES.items():
        sent_before = len(s.model.requests)
        await s.send(probe)
        seen = "\n".join(m.content for r in s.model.requests[sent_before:] for m in r.messages)
        if expected in seen:
            found += 1
        else:
            missed.append(probe)
    assert found / len(PROBES) >= 0.95, f"missed: {missed}"

    events = await s.events()
    summaries = [e for e in events if isinstance(e, ev.HistorySummarized)]
    trims = [e for e in events if isinstance(e, ev.ContextTrimmed)]
    assert len(summaries) >= 5 and all(e.summarizer == "extractive" and not e.fallback for e in summaries)
    assert all(0 < e.tokens_after < e.tokens_before for e in summaries)
    assert all(e.history_tokens_after < e.history_tokens_before for e in trims)
    reasons = {item["reason"] for e in trims for item in json.loads(e.items_json)}
    assert {"small_talk", "corrected_error"} <= reasons
    for started in (e for e in events if isinstance(e, ev.ModelCallStarted)):
        assert section_tokens(started)["history"] <= budget, started.step
    for request in s.model.requests:
        assert provider_problems(request.messages) == []

    # a snapshot-based load and a full fold agree after all those compactions
    cold = await TurnRunner(s.log, lambda _: s.agent).load(s.sid)
    assert cold.messages == fold(s.sid, events).messages
    assert [m.ref for m in cold.messages] == [m.ref for m in fold(s.sid, events).messages]


async def test_tokens_sent_per_turn_stay_flat_once_the_budget_is_reached(tmp_path: Path) -> None:
    policy = ContextPolicy(window=4096, summarizer="extractive")
    s = await open_session(tmp_path, lambda r: ANSWER, context=policy)
    for _ in range(120):
        await s.send(FILLER)
    history = [section_tokens(e)["history"] for e in await s.of(ev.ModelCallStarted)]
    budget = policy.budgets(s.agent.model).history
    assert max(history) <= budget
    late = history[40:]
    assert max(late) - min(late) < budget * 0.6  # bounded, sawtooth between compactions
    assert history[-1] < history[39] * 2


@tool(idempotent=True, max_result_chars=200_000)
def export_table(name: str) -> str:
    """Export a whole table as text."""
    return f"{name}: " + "row of data with many columns and values; " * 3000


async def test_huge_tool_results_are_cut_to_fit_and_calls_keep_their_results(tmp_path: Path) -> None:
    def model(request: ModelRequest) -> ModelResponse | str:
        tools_done = sum(1 for m in request.messages if m.role == "tool" and m.name == "export_table")
        if request.messages[-1].role == "tool" and tools_done % 3 == 0:
            return "Exported."
        return reply("", call("export_table", {"name": f"t{tools_done}"}))

    policy = ContextPolicy(window=16_000, summarizer="extractive")
    s = await open_session(tmp_path, model, [export_table], context=policy)
    for _ in range(4):
        await s.send("Export the next three tables.")
    budget = policy.budgets(s.agent.model).history
    for started in await s.of(ev.ModelCallStarted):
        assert section_tokens(started)["history"] <= budget
    for request in s.model.requests:
        assert provider_problems(request.messages) == []
    trims = await s.of(ev.ContextTrimmed)
    oversized = [i for e in trims for i in json.loads(e.items_json) if i["reason"] == "oversized"]
    assert oversized and all("the full result is archived" in i["text"] for i in oversized)
    finished = await s.of(ev.ToolCallFinished)
    assert all(len(f.content) > 100_000 for f in finished)  # the log keeps every result whole


async def test_a_failing_summariser_falls_back_and_says_so(tmp_path: Path) -> None:
    from turnlog.engine import ModelError

    def broken(request: ModelRequest) -> str:
        raise ModelError("summariser endpoint is down")

    policy = ContextPolicy(window=2048, summarizer=FunctionModel(broken, name="cheap-summariser"))
    s = await open_session(tmp_path, lambda r: ANSWER, context=policy)
    await s.send("My order number is A-555 and I prefer email over phone.")
    for _ in range(30):
        await s.send(FILLER)
    summaries = await s.of(ev.HistorySummarized)
    assert summaries and all(e.fallback and e.summarizer == "extractive" for e in summaries)
    assert "summariser endpoint is down" in summaries[0].error
    assert summaries[0].summary.startswith(FALLBACK_NOTE)
    assert "A-555" in summaries[0].summary
    assert (await s.api.get_state(s.sid)).status == "FINISHED"


async def test_the_model_summariser_is_sent_the_oldest_third_and_its_summary_leads_the_history(
    tmp_path: Path,
) -> None:
    seen: list[ModelRequest] = []

    def summariser(request: ModelRequest) -> str:
        seen.append(request)
        return "Preferences: email over phone.\nFacts: order A-555."

    policy = ContextPolicy(window=2048, summarizer=FunctionModel(summariser, name="cheap-summariser"))
    s = await open_session(tmp_path, lambda r: ANSWER, context=policy)
    await s.send("My order number is A-555 and I prefer email over phone.")
    for _ in range(20):
        await s.send(FILLER)
    summary = (await s.of(ev.HistorySummarized))[0]
    assert summary.summarizer == "cheap-summariser" and summary.reason == "tokens"
    assert "A-555" in seen[0].messages[-1].content  # the transcript it summarised
    removed = json.loads(summary.removed_refs_json)
    assert removed[0] == 2  # from the first user message on (version 2)
    request = s.last_request()
    assert "Facts: order A-555." in request.messages[0].content
    assert request.messages[0].role == "system"


async def test_verbatim_turn_limit_summarises_older_turns(tmp_path: Path) -> None:
    policy = ContextPolicy(verbatim_turns=3, summarizer="extractive")
    s = await open_session(tmp_path, lambda r: "ok", context=policy)
    for i in range(6):
        await s.send(f"Message number {i}.")
    summaries = await s.of(ev.HistorySummarized)
    assert summaries and {e.reason for e in summaries} == {"turns"}
    users = [m.content for m in s.last_request().messages if m.role == "user"]
    assert users == ["Message number 2.", "Message number 3.", "Message number 4.", "Message number 5."]
    assert "Message number 0" in s.last_request().messages[0].content  # in the summary


async def test_referring_back_brings_archived_messages_into_context(tmp_path: Path) -> None:
    policy = ContextPolicy(window=2048, summarizer="extractive")
    s = await open_session(tmp_path, lambda r: ANSWER, context=policy)
    await s.send("Hello, I need help with the Hamburg delivery complaints from last week.")
    for _ in range(25):
        await s.send(FILLER)
    request_before = s.last_request()
    assert not any("Hamburg" in m.content for m in request_before.messages if m.role == "user")
    await s.send("What did I say at the start?")
    recalled = await s.of(ev.HistoryRecalled)
    assert len(recalled) == 1 and "Hamburg delivery complaints" in recalled[0].text
    assert 2 in json.loads(recalled[0].refs_json)
    request = s.last_request()
    block = [m for m in request.messages if m.content.startswith(RECALL_HEADER)]
    assert (
        block and request.messages.index(block[0]) == len(request.messages) - 2
    )  # right before the question


class ReportFilters(pydantic.BaseModel):
    date_range: str = "last_week"
    group_by: list[str] = []
    metrics: list[str] = ["orders"]


async def test_task_state_set_overwrite_and_reset_are_events_and_shown_every_step(tmp_path: Path) -> None:
    steps = iter(
        [
            reply("", call("update_task_state", {"op": "set", "values": {"group_by": ["region"]}})),
            "Grouped by region.",
            reply("", call("update_task_state", {"op": "set", "values": {"group_by": ["carrier"]}})),
            "Now by carrier.",
            reply("", call("update_task_state", {"op": "set", "values": {"colour": "red"}})),
            "That field does not exist.",
            reply("", call("update_task_state", {"op": "overwrite", "values": {"date_range": "last_month"}})),
            "Replaced.",
            reply("", call("update_task_state", {"op": "reset"})),
            "Reset.",
        ]
    )
    s = await open_session(tmp_path, lambda r: next(steps), task_state=ReportFilters)
    for text in (
        "Group by region",
        "Group by carrier instead",
        "Colour it red",
        "Only last month",
        "Start over",
    ):
        await s.send(text)
    changes = await s.of(ev.TaskStateChanged)
    assert [c.op for c in changes] == ["set", "set", "overwrite", "reset"]
    assert json.loads(changes[1].patch_json) == [{"op": "replace", "path": "/group_by", "value": ["carrier"]}]
    assert json.loads(changes[1].state_json)["group_by"] == ["carrier"]  # replaced, not appended
    assert json.loads(changes[2].state_json) == {
        "date_range": "last_month",
        "group_by": [],
        "metrics": ["orders"],
    }
    assert json.loads(changes[3].state_json) == ReportFilters().model_dump()
    refused = [f for f in await s.of(ev.ToolCallFinished) if f.status != "success"]
    assert len(refused) == 1 and "colour" in refused[0].content
    # every step is shown the state as it is then
    shown = [m.content for r in s.model.requests for m in r.messages if "Current task state" in m.content]
    assert len(shown) == len(s.model.requests)
    assert (
        '"group_by": ["carrier"]'
        in s.model.requests[3].messages[0].content + s.model.requests[3].messages[1].content
    )


async def test_context_length_error_compacts_and_retries_once_through_the_openai_sdk(tmp_path: Path) -> None:
    from tests.openai_server import FakeReply, serve_openai
    from turnlog.engine import Agent, AgentDirectory, AgentSessions, SqliteEventLog
    from turnlog.engine.models.openai_compat import OpenAICompatibleModel

    replies = [FakeReply(ANSWER * 3)] * 8 + [FakeReply("Answered after compaction.")]
    with serve_openai(replies, context_window=900) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url, api_key="k")
        agent = Agent("remote", model, context=ContextPolicy(window=128_000, summarizer="extractive"))
        log = SqliteEventLog(tmp_path / "log.db")
        api = AgentSessions(log, AgentDirectory([agent]))
        sid = (await api.create_session("remote", "u")).session_id
        for i in range(9):
            [item async for item in api.send_user_message(sid, f"{FILLER} Batch {i} of the list.")]
        events = await log.read_session(sid)
        await model.aclose()
    assert len(server.refused) >= 1
    failed = [e for e in events if isinstance(e, ev.ModelCallFinished) and e.status == "failed"]
    summaries = [e for e in events if isinstance(e, ev.HistorySummarized)]
    assert failed and "context length" in failed[0].error.lower()
    assert summaries and summaries[0].reason == "context_length"
    finished = [e for e in events if isinstance(e, ev.TurnFinished)]
    assert [f.reason for f in finished] == ["answered"] * 9
    assert (await api.get_state(sid)).messages[-1].content == "Answered after compaction."


@pytest.mark.parametrize(
    "text, small",
    [("thanks!", True), ("谢谢", True), ("OK", True), ("ok 42", False), ("Thanks, order A-1 please", False)],
)
def test_small_talk_is_short_chatter_without_numbers(text: str, small: bool) -> None:
    assert is_small_talk(text) is small


class CountingModel(FunctionModel):
    """A rule model whose requests are counted with tiktoken, so budgets see their size."""

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        return count_chat_tokens(self.token_counter, request.messages, request.tools)


async def test_a_budget_that_would_stop_the_call_first_compacts_the_context(tmp_path: Path) -> None:
    from turnlog.engine import Agent, AgentDirectory, AgentSessions, SqliteEventLog

    prices = PriceTable.from_dict(
        {"models": {"counted": {"input": 2.5, "output": 10, "max_output_tokens": 1000}}}
    )
    long_answer = "The delivery report lists every late parcel with its carrier and the delay. " * 30
    model = CountingModel(lambda r: long_answer, name="counted")
    # a call costs 2.5 micros per input token plus up to 10_000 for its output: 20_000 a turn
    # holds about 4,000 tokens of context, which ten turns of these answers pass. The summaries
    # are written by a cheap model (unpriced here): a summary by the priced one would itself cost
    # most of a turn's budget, and it counts (test_costs.py)
    cheap = CountingModel(lambda r: "Late parcels were listed for earlier batches.", name="cheap")
    budget, context = Budget(per_turn_micros=20_000), ContextPolicy(summarizer=cheap)
    agent = Agent("b", model, prices=prices, budget=budget, context=context)
    log = SqliteEventLog(tmp_path / "log.db")
    api = AgentSessions(log, AgentDirectory([agent]))
    sid = (await api.create_session("b", "u")).session_id
    for i in range(14):
        [item async for item in api.send_user_message(sid, f"Show the late parcels of batch {i}.")]
    events = await log.read_session(sid)
    summaries = [e for e in events if isinstance(e, ev.HistorySummarized)]
    assert summaries and {e.reason for e in summaries} == {"budget"}
    assert [e.reason for e in events if isinstance(e, ev.TurnFinished)] == ["answered"] * 14
    summarizer_calls = [e for e in events if isinstance(e, ev.AuxiliaryModelCall)]
    assert [(c.purpose, c.model, c.cost_micros) for c in summarizer_calls] == [("summary", "cheap", 0)] * len(
        summaries
    )
    for started in (e for e in events if isinstance(e, ev.ModelCallStarted)):
        assert started.estimated_input_tokens * 2.5 + 10_000 <= 20_000


async def test_the_archive_projection_keeps_every_cut_message_with_what_cut_it(tmp_path: Path) -> None:
    from turnlog.projections.queries import archived_messages

    policy = ContextPolicy(window=2048, summarizer="extractive")
    s = await open_session(tmp_path, lambda r: ANSWER, context=policy)
    await s.send("My order number is A-555.")
    for i in range(25):
        await s.send("thanks!" if i % 4 == 3 else FILLER)
    cut: dict[int, tuple[int, str]] = {}
    for e in await s.events():
        if isinstance(e, ev.ContextTrimmed):
            cut |= {i["ref"]: (e.version, f"{i['action']}: {i['reason']}") for i in json.loads(e.items_json)}
        elif isinstance(e, ev.HistorySummarized):
            cut |= {ref: (e.version, f"summarized: {e.reason}") for ref in json.loads(e.removed_refs_json)}
    store = await s.project(tmp_path / "projections.db")
    rows = archived_messages(store, s.sid)
    summary_refs = {e.version for e in await s.of(ev.HistorySummarized)}  # a summary is not a message row
    assert {r["version"]: (r["archived_by"], r["archive_reason"]) for r in rows} == {
        ref: why for ref, why in cut.items() if ref not in summary_refs
    }
    assert rows[0]["content"] == "My order number is A-555." and rows[0]["role"] == "user"
    assert {r["archive_reason"] for r in rows} >= {"removed: small_talk", "summarized: tokens"}
    store.close()


async def test_a_steady_conversation_calls_the_summariser_at_most_once_per_n_turns(log: EventLog) -> None:
    """Each summary cuts the history down to ``summarize_to`` (50 %) of its budget, not just
    below the 90 % threshold, so the next one waits until the history has grown back by 40 %:
    N = (summarize_at - summarize_to) * history budget / tokens a turn adds (docs)."""
    from turnlog.engine.context.tally import message_tokens
    from turnlog.engine.messages import ChatMessage

    summaries: list[ModelRequest] = []

    def summariser(request: ModelRequest) -> str:
        summaries.append(request)
        return "Earlier: batches were checked; two parcels late in each."

    policy = ContextPolicy(window=4096, summarizer=FunctionModel(summariser, name="summariser"))
    model = FunctionModel(lambda r: ANSWER, name="rule-model")
    s = await tool_harness.open_session(log, model, context=policy)
    turns = 120
    for i in range(turns):
        await s.send(f"Check batch {i:03d} for late parcels.")
    started = await s.of(ev.ModelCallStarted)
    counter = s.model.token_counter
    question, answer = ChatMessage.user("Check batch 000 for late parcels."), ChatMessage("assistant", ANSWER)
    per_turn = message_tokens(counter, question) + message_tokens(counter, answer)
    budget = policy.budgets(s.model).history
    n = int((policy.summarize_at - policy.summarize_to) * budget / per_turn)
    turn_of = {e.turn_id: i for i, e in enumerate(await s.of(ev.TurnStarted))}
    summarised = [turn_of[e.turn_id] for e in await s.of(ev.HistorySummarized)]
    assert len(summaries) == len(summarised) >= 3, "the conversation ran long enough to summarise often"
    gaps = [b - a for a, b in zip(summarised, summarised[1:], strict=False)]
    print(f"summaries at turns {summarised}; N = {n} ({per_turn} tokens a turn, history budget {budget})")
    assert min(gaps) >= n - 1, f"summaries at turns {summarised}; N = {n} ({per_turn} tokens a turn)"
    assert all(section_tokens(e)["history"] <= 0.9 * budget + per_turn for e in started)
