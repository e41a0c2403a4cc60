"""A worker killed mid-turn (SIGKILL, no cleanup) and a fresh one continuing from the log.

The killed process is `tests/procs.py crash`. What was recorded before the kill is reused: the
model's first answer is not asked for again; a started idempotent tool runs again; a started
non-idempotent tool is not repeated but reported as interrupted (its outcome is unknown).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import QUESTION, answer, tool_name
from tests.procs import RECOVERY_PARTITIONS as PARTITIONS
from tests.procs import recovery_agent as build_agent
from turnlog.engine import AgentDirectory, AgentSessions, FunctionModel, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.tools import MARKERS, ToolStatus
from turnlog.projections import SqliteProjectionStore

REPO = Path(__file__).resolve().parent.parent
SID = "session-crash"
BEFORE_KILL = [
    "SessionCreated",
    "UserMessageReceived",
    "TurnStarted",
    "StateChanged",
    "ModelCallStarted",
    "ModelCallFinished",
    "AssistantMessage",
    "ToolCallRequested",
    "StateChanged",
    "ToolCallStarted",
]


def types(events: list[ev.Event]) -> list[str]:
    return [e.type for e in events]


async def run_until_killed(log_path: Path, kind: str, until: str) -> list[ev.Event]:
    """Start `procs.py crash`, SIGKILL it once an event of type ``until`` is on the log; the log then."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "procs.py"), "crash", str(log_path), SID, kind],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    watcher = None
    try:
        for _ in range(3000):  # polls every 10 ms: at most ~30 s before the test fails
            if log_path.exists():
                watcher = watcher or SqliteEventLog(log_path, partitions=PARTITIONS)
                if until in types(await watcher.read_session(SID)):
                    break
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"procs.py crash exited with {proc.returncode} before {until}: {err}")
            await asyncio.sleep(0.01)
        else:
            pytest.fail(f"no {until} on the log")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        if watcher is not None:
            await watcher.close()
    log = SqliteEventLog(log_path, partitions=PARTITIONS)
    try:
        return await log.read_session(SID)
    finally:
        await log.close()


class Successor:
    """A fresh worker on the same file: a model that counts its calls and a tool that returns."""

    def __init__(self, log: SqliteEventLog, kind: str) -> None:
        self.model = FunctionModel(answer)
        self.tool_calls: list[str] = []
        self.keys: list[str] = []

        async def handler(order_id: str, idempotency_key: str) -> str:
            self.tool_calls.append(order_id)
            self.keys.append(idempotency_key)
            return f"order {order_id} is packed"

        self.api = AgentSessions(
            log, AgentDirectory([build_agent(kind, self.model, handler)]), producer="worker-2"
        )

    async def run_pending(self) -> list[object]:
        return [item async for item in self.api.run_pending(SID)]


def after_tools(finished_count: int = 1) -> list[str]:
    return [
        *["ToolCallFinished"] * finished_count,
        "StateChanged",
        "SnapshotTaken",
        "ModelCallStarted",
        "ModelCallFinished",
        "AssistantMessage",
        "StateChanged",
        "TurnFinished",
        "SnapshotTaken",
    ]


async def test_killed_during_an_idempotent_tool_the_tool_runs_again(log_path: Path) -> None:
    before = await run_until_killed(log_path, "lookup", until="ToolCallStarted")
    assert types(before) == BEFORE_KILL
    assert before[-1].producer == "crash-worker"

    log = SqliteEventLog(log_path, partitions=PARTITIONS)
    try:
        successor = Successor(log, "lookup")
        streamed = await successor.run_pending()
        events = await log.read_session(SID)
    finally:
        await log.close()

    assert events[: len(before)] == before, "nothing recorded before the kill is rewritten"
    new = events[len(before) :]
    assert types(new) == ["ToolCallStarted", *after_tools()]
    again, done = new[0], new[1]
    assert isinstance(again, ev.ToolCallStarted) and isinstance(done, ev.ToolCallFinished)
    assert (again.call_id, again.tool_name, again.attempt) == ("call-1", tool_name("lookup"), 2)
    assert (done.status, done.attempts, done.content) == ("success", 2, "order A-17 is packed")
    assert successor.tool_calls == ["A-17"]
    # the ledger: the key the killed attempt was started with is the key the retry is given
    killed = before[-1]
    assert isinstance(killed, ev.ToolCallStarted) and len(killed.idempotency_key) == 64
    assert successor.keys == [killed.idempotency_key] == [again.idempotency_key]
    assert_turn_finished_with_one_more_model_call(successor, events, new, streamed)


async def test_killed_during_a_non_idempotent_tool_it_is_reported_interrupted_not_rerun(
    log_path: Path,
) -> None:
    before = await run_until_killed(log_path, "send", until="ToolCallStarted")
    assert types(before) == BEFORE_KILL

    log = SqliteEventLog(log_path, partitions=PARTITIONS)
    try:
        successor = Successor(log, "send")
        streamed = await successor.run_pending()
        events = await log.read_session(SID)
    finally:
        await log.close()

    assert events[: len(before)] == before
    new = events[len(before) :]
    assert types(new) == after_tools()
    done = new[0]
    assert isinstance(done, ev.ToolCallFinished)
    assert (done.call_id, done.tool_name, done.status) == ("call-1", "slow_send", "interrupted")
    assert done.content.startswith(MARKERS[ToolStatus.INTERRUPTED])
    assert done.content == (  # what is known (nothing about its effect), and one instruction
        "[FAILED: INTERRUPTED, OUTCOME UNKNOWN] slow_send was running when its worker stopped, and it is "
        "not run again, since a repeat could do it twice. Whether it took effect is unknown. Tell the "
        "user it is not known whether it was done."
    )
    assert done.attempts == 1, "it was attempted once, before the kill"
    assert successor.tool_calls == [], "a send that may have happened must not be repeated"
    started = before[-1]  # its intent was on the log before it ran: call id, key, arguments
    assert isinstance(started, ev.ToolCallStarted) and started.idempotency_key
    (requested,) = [e for e in before if isinstance(e, ev.ToolCallRequested)]
    assert (requested.call_id, json.loads(requested.arguments_json)) == ("call-1", {"order_id": "A-17"})
    assert_turn_finished_with_one_more_model_call(successor, events, new, streamed)
    (request,) = successor.model.requests
    assert request.messages[-1].content == done.content  # the model is told the outcome is unknown


def assert_turn_finished_with_one_more_model_call(
    successor: Successor, events: list[ev.Event], new: list[ev.Event], streamed: list[object]
) -> None:
    # the first model answer recorded before the kill is reused: exactly one more model call
    (request,) = successor.model.requests
    assert [m.role for m in request.messages] == ["user", "assistant", "tool"]
    assert request.messages[0].content == QUESTION
    assert request.messages[1].tool_calls[0].call_id == "call-1"
    (started,) = [e for e in new if isinstance(e, ev.ModelCallStarted)]
    assert started.step == 1
    state_changes = [(e.from_state, e.to_state, e.cause) for e in events if isinstance(e, ev.StateChanged)]
    assert state_changes == [
        ("IDLE", "PROCESSING", "user_message"),
        ("PROCESSING", "TOOL_WAIT", "model_tool_call"),
        ("TOOL_WAIT", "PROCESSING", "tool_result"),
        ("PROCESSING", "FINISHED", "model_answer"),
    ]
    (finished,) = [e for e in events if isinstance(e, ev.TurnFinished)]
    assert (finished.reason, finished.iterations, finished.model_calls) == ("answered", 1, 2)
    assert len([e for e in events if isinstance(e, ev.TurnStarted)]) == 1
    assert [e.version for e in events] == list(range(1, len(events) + 1)), "no gaps"
    assert all(e.producer == "worker-2" for e in new)
    assert [i for i in streamed if isinstance(i, ev.Event)] == new


async def test_killed_during_the_model_call_the_call_is_made_again(log_path: Path) -> None:
    before = await run_until_killed(log_path, "model", until="ModelCallStarted")
    assert types(before) == BEFORE_KILL[:5]

    log = SqliteEventLog(log_path, partitions=PARTITIONS)
    try:
        successor = Successor(log, "model")
        await successor.run_pending()
        events = await log.read_session(SID)
        state = await successor.api.get_state(SID)
    finally:
        await log.close()

    new = events[len(before) :]
    assert types(new) == [
        "ModelCallFinished",  # the cut-off call: recorded with what was sent, then made again
        "ModelCallStarted",
        "ModelCallFinished",
        "AssistantMessage",
        "ToolCallRequested",
        "StateChanged",
        "ToolCallStarted",
        *after_tools(),
    ]
    cut_off, opened = new[0], before[-1]
    assert isinstance(cut_off, ev.ModelCallFinished) and isinstance(opened, ev.ModelCallStarted)
    assert (cut_off.step, cut_off.status, cut_off.estimated) == (0, "interrupted", True)
    assert cut_off.input_tokens == opened.estimated_input_tokens and cut_off.output_tokens == 0
    assert len(successor.model.requests) == 2 and successor.tool_calls == ["A-17"]
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert state.status == "FINISHED" and state.turn is None
    assert state.messages[-1].content == "Done: order A-17 is packed"
    started = [e.step for e in events if isinstance(e, ev.ModelCallStarted)]
    assert started == [0, 1, 2]  # the cut-off call keeps its number; steps stay unique

    store = SqliteProjectionStore(":memory:")
    try:
        store.apply_events(events)
        calls = [(m["step"], m["status"]) for m in store.rows_of("model_calls", SID)]
    finally:
        store.close()
    assert calls == [(0, "interrupted"), (1, "ok"), (2, "ok")]
