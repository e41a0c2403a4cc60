"""Token counting offline, the price table, cost on every model call, and budgets that stop a
turn before it overspends. Costs are read back from the log and from the projections."""

from __future__ import annotations

import datetime as dt
import hashlib
from decimal import Decimal
from pathlib import Path

import pytest

from tests.openai_server import FakeReply, serve_openai
from turnlog.consumers.projector import Projector
from turnlog.engine import AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.agent import Agent, AgentDirectory
from turnlog.engine.budget import Budget, SpendLedger
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.messages import ChatMessage
from turnlog.engine.models.base import ModelRequest, ModelResponse, Usage
from turnlog.engine.models.openai_compat import OpenAICompatibleModel
from turnlog.engine.models.pricing import Price, PriceTable
from turnlog.engine.models.scripted import FunctionModel, call
from turnlog.engine.models.tokens import (
    O200K_LOCATION,
    TiktokenCounter,
    count_chat_tokens,
    encoding_name_for,
    install_o200k,
)
from turnlog.engine.tools.registry import tool
from turnlog.projections import SqliteProjectionStore

PRICES = PriceTable.from_dict(
    {
        "models": {
            "priced-model": {"input": 2.5, "cached_input": 1.25, "output": 10, "max_output_tokens": 1000},
            "fake-gpt*": {"input": "0.15", "output": "0.60"},
        }
    }
)


# -- tokens ---------------------------------------------------------------------------------------


def test_both_encodings_count_offline() -> None:
    assert TiktokenCounter("cl100k_base").count("hello world") == 2
    assert TiktokenCounter("o200k_base").count("hello world") == 2
    # the encodings differ where it matters: o200k is much better at Chinese
    text = "请把上周物流异常的订单找出来，给每位客户发一条致歉通知。"
    assert TiktokenCounter("o200k_base").count(text) < TiktokenCounter("cl100k_base").count(text)


def test_o200k_file_is_placed_where_tiktoken_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    path = install_o200k()
    assert path == tmp_path / hashlib.sha1(O200K_LOCATION.encode()).hexdigest()
    # tiktoken verifies this hash when it loads the file
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    )


@pytest.mark.parametrize(
    "model, encoding",
    [("gpt-4o-mini", "o200k_base"), ("openai/gpt-5", "o200k_base"), ("o3-mini", "o200k_base"),
     ("gpt-4", "cl100k_base"), ("qwen2.5", "cl100k_base")],
)  # fmt: skip
def test_encoding_by_model_name(model: str, encoding: str) -> None:
    assert encoding_name_for(model) == encoding


def test_chat_count_includes_framing_calls_and_tools() -> None:
    counter = TiktokenCounter()
    messages = [ChatMessage.system("Be brief."), ChatMessage.user("hello world")]
    bare = count_chat_tokens(counter, messages)
    assert bare == 3 + (3 + counter.count("Be brief.")) + (3 + 2)
    tool_spec = {"name": "get_time", "description": "Local time.", "parameters": {"type": "object"}}
    assert count_chat_tokens(counter, messages, [tool_spec]) > bare


async def test_estimate_is_recorded_before_each_call_and_usage_comes_from_the_provider(
    tmp_path: Path,
) -> None:
    with serve_openai([FakeReply("Hi there.", usage=(41, 3))], model="fake-gpt-1") as server:
        model = OpenAICompatibleModel("fake-gpt-1", base_url=server.base_url, api_key="k")
        log, api = _api(tmp_path, Agent.build("a", model, prices=PRICES))
        session = await api.create_session("a", "u")
        events = [
            e
            async for e in api.send_user_message(session.session_id, "hello world")
            if isinstance(e, ev.Event)
        ]
        await model.aclose()
        await log.close()
    started = next(e for e in events if isinstance(e, ev.ModelCallStarted))
    counter = TiktokenCounter("cl100k_base")
    assert started.estimated_input_tokens == count_chat_tokens(counter, [ChatMessage.user("hello world")])
    finished = next(e for e in events if isinstance(e, ev.ModelCallFinished))
    assert (finished.input_tokens, finished.output_tokens) == (41, 3)  # the server's numbers, not ours
    assert finished.cost_micros == round(41 * 0.15 + 3 * 0.60)  # "fake-gpt*" prices, per 1M tokens
    assert server.requests[0]["stream_options"] == {"include_usage": True}


# -- prices ---------------------------------------------------------------------------------------


def test_cost_is_exact_integer_micro_dollars() -> None:
    price = PRICES.price_for("priced-model")
    assert price is not None
    # 1234 in at $2.50/M, 567 out at $10/M = 3085 + 5670 micro-dollars
    assert price.cost_micros(1234, 567) == 8755
    # 1000 of the 1234 input tokens from the cache at $1.25/M
    assert price.cost_micros(1234, 567, cached_input_tokens=1000) == 585 + 1250 + 5670
    assert price.worst_case_micros(100) == 250 + 10_000


def test_prefix_prices_and_unpriced_models() -> None:
    assert PRICES.price_for("fake-gpt-2024-08") == Price(Decimal("0.15"), Decimal("0.15"), Decimal("0.60"))
    assert PRICES.price_for("other") is None
    assert PRICES.cost_micros("other", 10**6, 10**6) == 0


@pytest.mark.parametrize(
    "table, problem",
    [
        ({}, "expected"),
        ({"models": {"m": {"output": 1}}}, "no 'input' price"),
        ({"models": {"m": {"input": "cheap", "output": 1}}}, "not a number"),
        ({"models": {"m": {"input": -1, "output": 1}}}, "not a number"),
        ({"models": {"m": 3}}, "needs an object"),
    ],
)
def test_bad_price_tables_say_what_is_wrong(table: dict, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        PriceTable.from_dict(table)


def test_price_table_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text('{"models": {"m": {"input": 1, "output": 2}}}')
    assert PriceTable.load(path).cost_micros("m", 10**6, 10**6) == 3_000_000
    path.write_text("{not json")
    with pytest.raises(ConfigurationError, match="cannot read the price table"):
        PriceTable.load(path)


async def test_streamed_and_whole_answers_cost_the_same(tmp_path: Path) -> None:
    answer = ModelResponse("A fairly long answer " * 20, usage=Usage(900, 120, 300), model="priced-model")
    costs = []
    for chunk_chars in (0, 7):
        model = FunctionModel(lambda _: answer, name="priced-model", chunk_chars=chunk_chars)
        log, api = _api(tmp_path / str(chunk_chars), Agent.build("a", model, prices=PRICES))
        session = await api.create_session("a", "u")
        events = [e async for e in api.send_user_message(session.session_id, "hi") if isinstance(e, ev.Event)]
        await log.close()
        costs.append(next(e.cost_micros for e in events if isinstance(e, ev.ModelCallFinished)))
    assert costs[0] == costs[1] == PRICES.cost_micros("priced-model", 900, 120, 300)


# -- budgets --------------------------------------------------------------------------------------


def _api(home: Path, agent: Agent, ledger: SpendLedger | None = None) -> tuple[SqliteEventLog, AgentSessions]:
    home.mkdir(parents=True, exist_ok=True)
    log = SqliteEventLog(home / "log.db", partitions=2)
    return log, AgentSessions(log, AgentDirectory([agent]), spend_ledger=ledger)


def _turn_end(events: list[ev.Event]) -> ev.TurnFinished:
    return [e for e in events if isinstance(e, ev.TurnFinished)][-1]


def _tool_loop_model(usage: Usage) -> FunctionModel:
    """Asks for a lookup until it has one result, then answers; each call reports ``usage``."""

    def decide(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].role == "tool":
            return ModelResponse("Done.", usage=usage, model="priced-model")
        return ModelResponse("", (call("lookup", {}),), usage=usage, model="priced-model")

    return FunctionModel(decide, name="priced-model")


@tool(idempotent=True)
def lookup() -> str:
    """Look something up."""
    return "found"


async def test_turn_budget_stops_before_the_call_that_could_overrun(tmp_path: Path) -> None:
    # each call costs 100*2.5 + 100*10 = 1250 micros; the worst case before a call with an
    # estimate of 0 tokens is the output allowance 1000*10 = 10_000 micros
    agent = Agent.build(
        "a", _tool_loop_model(Usage(100, 100)), [lookup], prices=PRICES, budget=Budget(per_turn_micros=11_000)
    )
    log, api = _api(tmp_path, agent)
    session = await api.create_session("a", "u")
    items = [e async for e in api.send_user_message(session.session_id, "go") if isinstance(e, ev.Event)]
    await log.close()
    assert sum(isinstance(e, ev.ModelCallStarted) for e in items) == 1  # 1250 + 10_000 > 11_000
    assert any(isinstance(e, ev.ToolCallFinished) for e in items)  # the first step's work is kept
    stop = next(e for e in items if isinstance(e, ev.StateChanged) and e.to_state == "FINISHED")
    assert (stop.cause, stop.detail) == ("budget", "per-turn budget")
    answer = [e for e in items if isinstance(e, ev.AssistantMessage)][-1]
    assert "per-turn budget of $0.011000 has $0.009750 left" in answer.text
    finished = _turn_end(items)
    assert (finished.reason, finished.cost_micros) == ("budget", 1250)


async def test_session_budget_counts_earlier_turns(tmp_path: Path) -> None:
    agent = Agent.build(
        "a",
        FunctionModel(lambda _: ModelResponse("ok", usage=Usage(100, 100)), name="priced-model"),
        prices=PRICES,
        budget=Budget(per_session_micros=11_000),
    )
    log, api = _api(tmp_path, agent)
    session = await api.create_session("a", "u")
    first = [e async for e in api.send_user_message(session.session_id, "one") if isinstance(e, ev.Event)]
    second = [e async for e in api.send_user_message(session.session_id, "two") if isinstance(e, ev.Event)]
    state = await api.get_state(session.session_id)
    await log.close()
    assert _turn_end(first).reason == "answered"
    assert _turn_end(second).reason == "budget"
    # before stopping, the turn tried a shorter context: the summary the agent's own (priced)
    # model wrote for it was a paid call, and it counts like the first turn's
    (summary,) = [e for e in second if isinstance(e, ev.AuxiliaryModelCall)]
    assert (summary.purpose, summary.cost_micros) == ("summary", 1250)
    assert state.cost_micros == 1250 + 1250 == _turn_end(first).cost_micros + _turn_end(second).cost_micros


async def test_daily_user_budget_spans_sessions_through_the_projection(tmp_path: Path) -> None:
    agent = Agent.build(
        "a",
        FunctionModel(lambda _: ModelResponse("ok", usage=Usage(100, 100)), name="priced-model"),
        prices=PRICES,
        budget=Budget(per_user_day_micros=11_000),
    )
    store = SqliteProjectionStore(tmp_path / "projections.db")
    log, api = _api(tmp_path, agent, ledger=store)
    projector = Projector(log, store)
    outcomes = []
    for user in ("alice", "alice", "bob"):
        session = await api.create_session("a", user)
        events = [e async for e in api.send_user_message(session.session_id, "hi") if isinstance(e, ev.Event)]
        outcomes.append(_turn_end(events).reason)
        await projector.catch_up()
    assert outcomes == ["answered", "budget", "answered"]  # bob has his own day
    today = dt.datetime.now(dt.UTC).date()
    assert store.spent_micros("alice", today) == store.spent_micros("bob", today) == 1250
    assert [(r["user_id"], r["cost_micros"]) for r in store.costliest_users()] == [
        ("alice", 1250),
        ("bob", 1250),
    ]
    assert [r["cost_micros"] for r in store.costliest_sessions()] == [1250, 1250, 0]
    assert store.cost_by_day() == [{"day": today.isoformat(), "cost_micros": 2500, "calls": 2}]
    store.close()
    await log.close()


async def test_a_pausing_budget_waits_for_the_user_to_raise_it_then_the_turn_goes_on(tmp_path: Path) -> None:
    budget = Budget(per_turn_micros=11_000, on_exceed="pause")
    agent = Agent.build("a", _tool_loop_model(Usage(100, 100)), [lookup], prices=PRICES, budget=budget)
    log, api = _api(tmp_path, agent)
    sid = (await api.create_session("a", "u")).session_id
    [e async for e in api.send_user_message(sid, "go")]
    state = await api.get_state(sid)
    assert state.status == "PAUSED_FOR_USER" and state.turn is not None
    exceeded = [e for e in await log.read_session(sid) if isinstance(e, ev.BudgetExceeded)]
    assert [(e.level, e.limit_micros, e.spent_micros, e.worst_case_micros) for e in exceeded] == [
        ("per-turn", 11_000, 1250, 10_000)
    ]
    # a fresh front door (another process, after a restart) reads the pause from the log
    _, other = _api(tmp_path, agent)
    items = [e async for e in other.decide_budget(sid, "raise", extra_micros=5_000, note="ok, go on")]
    events = [e for e in items if isinstance(e, ev.Event)]
    decided = next(e for e in events if isinstance(e, ev.BudgetDecided))
    assert (decided.decision, decided.extra_micros, decided.note) == ("raise", 5_000, "ok, go on")
    resumed = next(e for e in events if isinstance(e, ev.StateChanged))
    assert (resumed.from_state, resumed.to_state, resumed.cause) == (
        "PAUSED_FOR_USER",
        "PROCESSING",
        "user_approval",
    )
    assert _turn_end(events).reason == "answered" and _turn_end(events).cost_micros == 2500
    await log.close()


async def test_a_pausing_budget_stopped_by_the_user_ends_the_turn_with_a_message(tmp_path: Path) -> None:
    from turnlog.engine.errors import InputError, NotAwaitingBudgetError

    budget = Budget(per_turn_micros=11_000, on_exceed="pause")
    agent = Agent.build("a", _tool_loop_model(Usage(100, 100)), [lookup], prices=PRICES, budget=budget)
    log, api = _api(tmp_path, agent)
    sid = (await api.create_session("a", "u")).session_id
    with pytest.raises(NotAwaitingBudgetError, match=r"\(IDLE\): no turn is waiting for a budget decision"):
        await api.post_budget_decision(sid, "raise", extra_micros=1)
    [e async for e in api.send_user_message(sid, "go")]
    with pytest.raises(InputError, match="extra_micros > 0"):
        await api.post_budget_decision(sid, "raise")
    events = [e async for e in api.decide_budget(sid, "stop") if isinstance(e, ev.Event)]
    stop = next(e for e in events if isinstance(e, ev.StateChanged))
    assert (stop.from_state, stop.to_state, stop.cause) == ("PAUSED_FOR_USER", "FINISHED", "budget")
    answer = next(e for e in events if isinstance(e, ev.AssistantMessage))
    assert "per-turn budget is spent" in answer.text
    assert _turn_end(events).reason == "budget"
    assert (await api.get_state(sid)).turn is None
    await log.close()


async def test_a_budget_raise_posted_by_a_producer_is_carried_on_by_a_turn_worker(tmp_path: Path) -> None:
    from turnlog.consumers import TurnWorker

    budget = Budget(per_turn_micros=11_000, on_exceed="pause")
    agent = Agent.build("a", _tool_loop_model(Usage(100, 100)), [lookup], prices=PRICES, budget=budget)
    log, producer = _api(tmp_path, agent)
    sid = (await producer.create_session("a", "u")).session_id
    await producer.post_user_message(sid, "go")
    worker = TurnWorker(log, AgentDirectory([agent]), worker_id="w1")
    await worker.poll_once()
    assert (await producer.get_state(sid)).status == "PAUSED_FOR_USER"
    await producer.post_budget_decision(sid, "raise", extra_micros=5_000)
    await worker.poll_once()
    events = await log.read_session(sid)
    assert _turn_end(events).reason == "answered" and events[-1].producer == "w1"
    await log.close()
