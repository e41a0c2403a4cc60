"""Messages and cancels that arrive while a turn runs (seed §7.3, §8), and decisions that lose
the version race (basis_version, rebase, refold). Everything runs on a real SQLite log; a
second AgentSessions on the same log plays the other producer (a gateway, a second user tab).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from turnlog.consumers import TurnWorker
from turnlog.consumers.turn_worker import GROUP
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    ChatMessage,
    FunctionModel,
    Model,
    ModelRequest,
    ModelResponse,
    SessionClosedError,
    SqliteEventLog,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.errors import NoTurnRunningError
from turnlog.engine.models.base import ModelChunk, Usage
from turnlog.engine.states import Cause, SessionStatus
from turnlog.engine.writer import SessionWriter

AGENT = "helper"
WAIT = 30.0  # generous: the machine is shared


def of(events: Sequence[Any], cls: type[ev.E]) -> list[ev.E]:
    return [e for e in events if isinstance(e, cls)]


def path(events: Sequence[ev.Event]) -> list[tuple[str, str, str]]:
    return [(e.from_state, e.to_state, e.cause) for e in events if isinstance(e, ev.StateChanged)]


@dataclass
class Gate:
    """A slow tool's or model's moment: ``entered`` once it runs, it waits for ``release``."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    runs: list[str] = field(default_factory=list)

    async def pass_through(self, what: str) -> None:
        self.runs.append(what)
        self.entered.set()
        await asyncio.wait_for(self.release.wait(), WAIT)


def slow_tool(gate: Gate) -> Any:
    @tool(timeout_s=WAIT * 2)
    async def send_notices(batch: str) -> str:
        """Send the apology notices of a batch (slow)."""
        await gate.pass_through(batch)
        return f"sent batch {batch}"

    return send_notices


def model_fn(request: ModelRequest) -> ModelResponse | str:
    """Asks for the slow tool for 'notify ...' messages, answers everything else directly."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    text = request.messages[last_user].content
    done = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if text.startswith("notify") and not done:
        return reply("", call("send_notices", {"batch": text.split()[-1]}, f"call-{text.split()[-1]}"))
    return f"answer to: {text}"


@dataclass
class Setup:
    api: AgentSessions
    other: AgentSessions
    log: SqliteEventLog
    sid: str
    model: FunctionModel


async def setup(
    log: SqliteEventLog, gate: Gate, *, on_message: str = "queue", model: Model | None = None
) -> Setup:
    fm = model or FunctionModel(model_fn)
    agent = Agent(AGENT, fm, [slow_tool(gate)], on_message=on_message)  # type: ignore[arg-type]
    agents = AgentDirectory([agent])
    api = AgentSessions(log, agents, producer="tab-1")
    other = AgentSessions(log, agents, producer="tab-2")
    sid = (await api.create_session(AGENT, "u-1")).session_id
    return Setup(api, other, log, sid, fm)  # type: ignore[arg-type]


async def drain(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


async def test_wait_stop_that_during_a_slow_tool_keeps_its_result_and_answers_the_new_message(
    log: SqliteEventLog,
) -> None:
    gate = Gate()
    s = await setup(log, gate, on_message="interrupt")
    running = asyncio.create_task(drain(s.api.send_user_message(s.sid, "notify batch-1")))
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    stop = (await s.other.post_user_message(s.sid, "wait, stop that")).event
    gate.release.set()
    streamed = await asyncio.wait_for(running, WAIT)

    events = await log.read_session(s.sid)
    assert gate.runs == ["batch-1"], "the running tool finished; nothing else ran"
    (result,) = of(events, ev.ToolCallFinished)
    assert (result.status, result.content) == ("success", "sent batch batch-1")
    assert result.version > stop.version, "the result was rebased over the message"
    started = of(events, ev.ToolCallStarted)[0]
    assert result.basis_version == started.version, "it keeps the version it was decided from"
    assert path(events) == [
        ("IDLE", "PROCESSING", "user_message"),
        ("PROCESSING", "TOOL_WAIT", "model_tool_call"),
        ("TOOL_WAIT", "PROCESSING", "tool_result"),
        ("PROCESSING", "CANCELLED", "interrupt"),
        ("CANCELLED", "PROCESSING", "user_message"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]
    cancelled = [e for e in of(events, ev.StateChanged) if e.to_state == "CANCELLED"][0]
    assert cancelled.detail == "interrupted by a new message: wait, stop that"
    first, second = of(events, ev.TurnFinished)
    assert (first.reason, first.model_calls, second.reason) == ("cancelled", 1, "answered")
    # no model call started between the tool result and the cancellation
    between = [e for e in events if result.version < e.version < cancelled.version]
    assert not of(between, ev.ModelCallStarted)
    # the new message is answered next, with the interrupted work in its context
    assert len(s.model.requests) == 2
    assert [(m.role, m.content) for m in s.model.requests[1].messages] == [
        ("user", "notify batch-1"),
        ("assistant", ""),
        ("tool", "sent batch batch-1"),
        ("user", "wait, stop that"),
    ]
    assert of(events, ev.AssistantMessage)[-1].text == "answer to: wait, stop that"
    assert (await s.api.get_state(s.sid)).status == SessionStatus.FINISHED
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert of(streamed, ev.TurnFinished) == [first, second]


async def test_queue_policy_three_quick_messages_wait_for_the_turn_then_run_in_order(
    log: SqliteEventLog,
) -> None:
    gate = Gate()
    s = await setup(log, gate, on_message="queue")
    third = AgentSessions(log, s.api.agents, producer="tab-3")
    running = asyncio.create_task(drain(s.api.send_user_message(s.sid, "notify batch-1")))
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    await asyncio.gather(
        s.other.post_user_message(s.sid, "one"),
        third.post_user_message(s.sid, "two"),
        s.other.post_user_message(s.sid, "three"),
    )
    gate.release.set()
    await asyncio.wait_for(running, WAIT)

    events = await log.read_session(s.sid)
    received = [e.text for e in of(events, ev.UserMessageReceived)]
    assert received[0] == "notify batch-1" and sorted(received[1:]) == ["one", "three", "two"]
    assert [f.reason for f in of(events, ev.TurnFinished)] == ["answered"] * 4
    assert "CANCELLED" not in {e.to_state for e in of(events, ev.StateChanged)}
    # the first turn finished its work (the model saw the tool result), then one turn per message
    answers = [a.text for a in of(events, ev.AssistantMessage) if a.text]
    assert answers == [f"answer to: {t}" for t in received]
    assert len(s.model.requests) == 5
    for request, text in zip(s.model.requests[1:], received, strict=True):
        users = [m.content for m in request.messages if m.role == "user"]
        assert users == received[: received.index(text) + 1], "never two new messages in one context"
    # turns never overlap on the log
    starts = [e.version for e in of(events, ev.TurnStarted)]
    ends = [e.version for e in of(events, ev.TurnFinished)]
    assert all(end < nxt for end, nxt in zip(ends, starts[1:], strict=False))


async def test_a_message_queued_before_the_turn_started_does_not_interrupt_it(log: SqliteEventLog) -> None:
    gate = Gate()
    gate.release.set()
    s = await setup(log, gate, on_message="interrupt")
    await s.api.post_user_message(s.sid, "notify batch-1")
    await s.api.post_user_message(s.sid, "and then this")
    await drain(s.api.run_pending(s.sid))
    events = await log.read_session(s.sid)
    assert [f.reason for f in of(events, ev.TurnFinished)] == ["answered", "answered"]
    assert gate.runs == ["batch-1"]


async def test_a_user_cancel_stops_the_turn_after_the_running_tool(log: SqliteEventLog) -> None:
    gate = Gate()
    s = await setup(log, gate)
    running = asyncio.create_task(drain(s.api.send_user_message(s.sid, "notify batch-1")))
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    cancelled = await s.other.cancel(s.sid, "changed my mind")
    request = cancelled.request
    assert (request.reason, request.actor, request.producer) == ("changed my mind", "user", "tab-2")
    assert request.basis_version == request.version - 1
    running_turn = (await s.api.get_state(s.sid)).turn
    assert running_turn is not None
    assert (cancelled.stopped_turn, cancelled.dropped) == (running_turn.turn_id, ())
    gate.release.set()
    await asyncio.wait_for(running, WAIT)

    events = await log.read_session(s.sid)
    assert of(events, ev.ToolCallFinished)[0].status == "success"
    assert path(events)[-1] == ("PROCESSING", "CANCELLED", "interrupt")
    assert of(events, ev.StateChanged)[-1].detail == "cancelled by user: changed my mind"
    assert len(s.model.requests) == 1 and of(events, ev.TurnFinished)[0].reason == "cancelled"
    assert isinstance(events[-1], ev.SnapshotTaken) and events[-1].status == "CANCELLED"
    # the session is usable again: the next message starts a new turn from CANCELLED
    await drain(s.api.send_user_message(s.sid, "hello again"))
    events = await log.read_session(s.sid)
    assert path(events)[-2:] == [
        ("CANCELLED", "PROCESSING", "user_message"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]


class GatedModel(Model):
    """Asks for the slow tool, but only after ``gate`` is released: a model step in flight."""

    name = "gated"

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.requests.append(request)
        await self.gate.pass_through("model")
        answer = reply("", call("send_notices", {"batch": "b"}, "call-b"))
        yield dataclasses.replace(answer, usage=Usage(120, 30))


async def test_a_cancel_racing_a_model_step_discards_the_decision_but_records_the_call(
    log: SqliteEventLog,
) -> None:
    model_gate, tool_gate = Gate(), Gate()
    model = GatedModel(model_gate)
    s = await setup(log, tool_gate, model=model)
    running = asyncio.create_task(drain(s.api.send_user_message(s.sid, "notify b")))
    await asyncio.wait_for(model_gate.entered.wait(), WAIT)
    cancel = (await s.other.cancel(s.sid, "too slow", actor="admin")).request
    model_gate.release.set()
    await asyncio.wait_for(running, WAIT)

    events = await log.read_session(s.sid)
    assert of(events, ev.AssistantMessage) == [], "the model's answer was never appended"
    assert of(events, ev.ToolCallRequested) == [] and tool_tool_never_ran(tool_gate)
    finished = of(events, ev.ModelCallFinished)
    assert [(f.status, f.error) for f in finished] == [("cancelled", "cancelled by admin: too slow")]
    # the call was made and paid for: its record keeps the provider's usage, put after the cancel
    assert (finished[0].input_tokens, finished[0].output_tokens, finished[0].estimated) == (120, 30, False)
    assert finished[0].basis_version < cancel.version < finished[0].version
    assert path(events)[-1] == ("PROCESSING", "CANCELLED", str(Cause.ADMIN))
    assert [e.version for e in events] == list(range(1, len(events) + 1))


def tool_tool_never_ran(gate: Gate) -> bool:
    return gate.runs == []


async def test_cancel_with_no_running_turn_is_refused_and_appends_nothing(log: SqliteEventLog) -> None:
    gate = Gate()
    s = await setup(log, gate)
    before = await log.session_version(s.sid)
    with pytest.raises(NoTurnRunningError, match="IDLE with no turn running, so there is nothing to cancel"):
        await s.api.cancel(s.sid)
    await s.api.force_finish(s.sid, "done")
    with pytest.raises(SessionClosedError):
        await s.api.cancel(s.sid)
    assert await log.session_version(s.sid) == before + 2  # only the force-finish


async def test_a_worker_applies_a_cancel_to_a_turn_whose_worker_died(log: SqliteEventLog) -> None:
    gate = Gate()
    s = await setup(log, gate)
    await s.api.post_user_message(s.sid, "notify b")
    # what a worker killed during its model call leaves behind
    state = await s.api.get_state(s.sid)
    w = SessionWriter(log, state, "dead-worker")
    w.add(ev.TurnStarted, turn_id="t1", message_id=state.inbox[0].message_id)
    w.transition(SessionStatus.PROCESSING, Cause.USER_MESSAGE)
    w.add(ev.ModelCallStarted, turn_id="t1", step=0, model="m", message_count=1, tools_offered=1)
    await w.commit()
    records = await log.read_partition(log.partition_of(s.sid), 0, 1000)
    message_offset = next(r.offset for r in records if isinstance(r.event, ev.UserMessageReceived))
    await log.commit(GROUP, log.partition_of(s.sid), message_offset + 1)  # its message was handled

    await s.other.cancel(s.sid, "stuck")
    worker = TurnWorker(log, s.api.agents, worker_id="w2")
    await worker.poll_once()

    events = await log.read_session(s.sid)
    assert path(events)[-1] == ("PROCESSING", "CANCELLED", "interrupt")
    assert of(events, ev.ModelCallFinished)[-1].status == "cancelled"
    assert s.model.requests == [] and gate.runs == []
    assert of(events, ev.TurnFinished)[-1].producer == "w2"


async def test_rebased_tool_results_and_the_history_stay_valid_for_the_next_turn(log: SqliteEventLog) -> None:
    """Interrupted in a chain of tool steps: every call the model asked for has its result in
    the next request, so it is a valid conversation."""
    gate = Gate()

    def two_calls(request: ModelRequest) -> ModelResponse | str:
        last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
        if request.messages[last_user].content == "go" and len(request.messages) == last_user + 1:
            return reply("", call("send_notices", {"batch": "x"}, "cx"))
        if request.messages[last_user].content == "go":
            return reply("", call("send_notices", {"batch": "y"}, "cy"))
        return "ok"

    s = await setup(log, gate, on_message="interrupt", model=FunctionModel(two_calls))
    running = asyncio.create_task(drain(s.api.send_user_message(s.sid, "go")))
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    await s.other.post_user_message(s.sid, "stop")
    gate.release.set()
    await asyncio.wait_for(running, WAIT)
    last = s.model.requests[-1]
    asked = [c.call_id for m in last.messages for c in m.tool_calls]
    answered = [m.tool_call_id for m in last.messages if m.role == "tool"]
    assert asked == answered == ["cx"]
    assert last.messages[-1] == ChatMessage.user("stop")


async def test_every_event_carries_the_version_it_was_decided_from(log: SqliteEventLog) -> None:
    """Without races, a step's events carry the version the step began at: the one before the
    first event of their commit. Producers' messages carry the version they read."""
    gate = Gate()
    gate.release.set()
    s = await setup(log, gate)
    await s.api.post_user_message(s.sid, "notify a")
    await drain(s.api.run_pending(s.sid))
    await drain(s.api.send_user_message(s.sid, "hello"))
    events = await log.read_session(s.sid)
    assert events[0].basis_version == 0  # SessionCreated: decided from nothing
    posted = of(events, ev.UserMessageReceived)[0]
    assert posted.basis_version == posted.version - 1
    runs: dict[int, list[int]] = {}
    for e in events[2:]:
        runs.setdefault(e.basis_version, []).append(e.version)
    for basis, versions in runs.items():
        assert versions == list(range(basis + 1, basis + 1 + len(versions))), (basis, versions)
    assert len(runs) == 4 + 2  # commits: 2K+2 for the turn with one tool step, 2 for the answer


def test_an_unknown_message_policy_is_refused() -> None:
    from turnlog.engine import ConfigurationError

    with pytest.raises(ConfigurationError, match="on_message must be 'queue' or 'interrupt', not 'drop'"):
        Agent(AGENT, FunctionModel(model_fn), on_message="drop")  # type: ignore[arg-type]
