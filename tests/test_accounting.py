"""Every model call the providers were sent is on the log with its tokens and cost, on both
backends: the turn's calls, the context summariser's, the memory extraction's, and a call a
cancel stopped mid-stream (what was sent, counted before sending, and what had streamed, marked
estimated). The cost projection's per-session, per-user and per-day sums equal the sum over
those calls, and the session's folded cost equals it too."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from pathlib import Path

from turnlog.consumers import Projector, TurnWorker
from turnlog.consumers.memory import MemoryConsumer
from turnlog.engine import Agent, AgentDirectory, AgentSessions, ContextPolicy, EventLog, FunctionModel, Model
from turnlog.engine import events as ev
from turnlog.engine.memory.embedders import UniversalSentenceEncoder
from turnlog.engine.memory.stores import open_store
from turnlog.engine.models.base import ModelChunk, ModelRequest, ModelResponse, TextDelta
from turnlog.engine.models.pricing import Price, PriceTable
from turnlog.engine.models.tokens import count_chat_tokens
from turnlog.projections.store import ProjectionStore

WAIT_S = 30.0
PRICES = PriceTable(
    {
        "talker": Price(Decimal("3"), Decimal("0.3"), Decimal("15")),
        "summarizer": Price(Decimal("0.5"), Decimal("0.05"), Decimal("1.5")),
        "extractor": Price(Decimal("1"), Decimal("0.1"), Decimal("4")),
    }
)
STREAMED = "Counting the late parcels of every carrier, one by one"
Reopen = Callable[[], AbstractAsyncContextManager[EventLog]]


class Talker(Model):
    """Answers at once, except a request whose last message says "slowly": it streams a first
    part and then never finishes (a long answer), until its task is cancelled."""

    name = "talker"

    def __init__(self) -> None:
        self.streaming = asyncio.Event()
        self.stopped = asyncio.Event()
        self.plain = FunctionModel(lambda r: f"noted: {r.messages[-1].content}", name=self.name)

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        return count_chat_tokens(self.token_counter, request.messages, request.tools)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if "slowly" not in request.messages[-1].content:
            async for chunk in self.plain.stream(request):  # usage counted by the rule model
                yield chunk
            return
        yield TextDelta(STREAMED)
        self.streaming.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopped.set()  # the provider's connection is closed: it stops generating
            raise
        yield ModelResponse("unreachable")


def of(events: list[ev.Event], cls: type[ev.E]) -> list[ev.E]:
    return [e for e in events if isinstance(e, cls)]


async def until_logged(log: EventLog, sid: str, condition: Callable[[list[ev.Event]], bool]) -> None:
    """Wait until the session's events satisfy ``condition`` (on Kafka, records submitted by a
    process that owns nothing are sequenced by the owner a moment later)."""
    async with asyncio.timeout(WAIT_S):
        while not condition(await log.read_session(sid)):
            await asyncio.sleep(0.02)


async def test_cost_per_session_user_and_day_is_the_sum_of_every_call_made(
    log: EventLog, store: ProjectionStore, reopen: Reopen, tmp_path: Path
) -> None:
    talker = Talker()
    summarizer = FunctionModel(lambda r: "Earlier: parcels were discussed.", name="summarizer")
    agent = Agent(
        "acct", talker, [], prices=PRICES, context=ContextPolicy(summarizer=summarizer, verbatim_turns=1)
    )
    agents = AgentDirectory([agent])
    api = AgentSessions(log, agents)
    sid = (await api.create_session("acct", "u-acct")).session_id
    for text in ("parcel A-1 is late", "parcel B-2 is late", "parcel C-3 is late"):
        async for _ in api.send_user_message(sid, text):  # the third turn summarises the first
            pass

    worker = TurnWorker(log, agents, worker_id="w")
    running = asyncio.create_task(worker.run())
    try:
        await api.post_user_message(sid, "count them slowly")
        await asyncio.wait_for(talker.streaming.wait(), WAIT_S)
        async with reopen() as other_log:  # a cancel from another process: the worker reads it
            await AgentSessions(other_log, agents).cancel(sid, "enough")
        await asyncio.wait_for(talker.stopped.wait(), WAIT_S)  # stopped mid-answer, not run to its end
        await until_logged(log, sid, lambda events: len(of(events, ev.TurnFinished)) == 4)
    finally:
        worker.stop()
        await running

    memory = open_store(tmp_path / "memory", embedder=UniversalSentenceEncoder())
    try:
        extractor = FunctionModel(lambda r: "[]", name="extractor")
        await MemoryConsumer(log, memory, extractor, prices=PRICES).catch_up()
    finally:
        await memory.close()

    def extractions(events: list[ev.Event]) -> int:
        return sum(1 for e in of(events, ev.AuxiliaryModelCall) if e.purpose == "memory_extraction")

    await until_logged(log, sid, lambda events: extractions(events) == 3)  # per answered turn

    events = await log.read_session(sid)
    calls = [e for e in events if isinstance(e, ev.ModelCallFinished | ev.AuxiliaryModelCall)]
    total = sum(c.cost_micros for c in calls)
    purposes = sorted({c.purpose for c in calls if isinstance(c, ev.AuxiliaryModelCall)})
    assert purposes == ["memory_extraction", "summary"]
    assert all(c.cost_micros > 0 for c in calls), "every call is priced by its own model's price"

    (stopped,) = [c for c in calls if isinstance(c, ev.ModelCallFinished) and c.status == "cancelled"]
    key = (stopped.turn_id, stopped.step)
    (started,) = [e for e in of(events, ev.ModelCallStarted) if (e.turn_id, e.step) == key]
    assert stopped.estimated and stopped.input_tokens == started.estimated_input_tokens > 0
    assert stopped.output_tokens == talker.token_counter.count(STREAMED)
    assert stopped.cost_micros == PRICES.cost_micros("talker", stopped.input_tokens, stopped.output_tokens)
    assert not any(c.estimated for c in calls if c is not stopped), "only the stopped call is an estimate"

    state = await api.get_state(sid)
    assert state.cost_micros == total
    await Projector(log, store).catch_up()
    rows = store.rows_of("model_calls", sid)
    assert sum(r["cost_micros"] for r in rows) == total and len(rows) == len(calls)
    assert [r["purpose"] for r in rows if r["estimated"]] == ["turn"]
    assert store.session(sid)["cost_micros"] == total  # type: ignore[index]
    (user,) = [u for u in store.costliest_users() if u["user_id"] == "u-acct"]
    assert user["cost_micros"] == total
    assert sum(d["cost_micros"] for d in store.cost_by_day()) == total
    (day,) = {r["day"] for r in rows}
    assert store.spent_micros("u-acct", dt.date.fromisoformat(day)) == total
