"""turnlog adapter for the shared peers benchmark (shared/peers-bench).

It belongs in ``shared/peers-bench/frameworks/turnlog_impl.py`` but shared/ is laid out
read-only, so it lives here and ``bench/peers/run_peers.py`` registers it with the unchanged
peers harness (``REGISTRY["turnlog"] = "turnlog_impl:TurnlogAdapter"``).

Native pattern: one ``engine.Agent`` (no system prompt) with one async idempotent tool
``lookup``, one ``AgentSessions`` front door on an ``EventLog``; a turn is
``async for item in api.send_user_message(session_id, text)``, which appends the user
message and then drives ``TurnRunner`` until the turn is finished. Each turn sends only the new
user message; the history is the session folded from the log (the runner keeps a cache of
folded sessions and reads only the events appended since, as in production).

Fake model: a ``turnlog.engine.models.base.Model`` subclass whose ``stream()`` does what the peers
README asks: await ``workload.model_latency``, count tool results after the last user message
in ``request.messages``, ``workload.decide(...)``, and yield one ``ModelResponse`` with one
tool call or the final text, with ``usage`` set (the engine never estimates usage for a custom
Model anyway; set so nothing else could).

Persistence: every step commits its events as one SQLite transaction, right before each model
call and at the end of the turn; ``lookup`` is idempotent, so its batch needs no commit of its
own before it runs (docs/architecture.md). That is K+2 commits per user turn with K tool steps:
the user message + turn start + model call started; per tool step: model answer + tool call
requested + started + tool result + next model call started; finally answer + turn finished.
The K appends after the idempotent tool's batches are redoable (lost, the model is asked again
and the tool runs again): they return once checked and ordered and are committed with the turn
end's append (or within 5 ms), so a turn takes two COMMITs, two fsyncs in ``sqlite`` mode.
Concurrent sessions share commits too (group commit: one fsync for all the appends made while
the previous one ran). The fsync pass (--count-fsyncs) counts them.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import AsyncIterator

import workload as W
from frameworks.base import FrameworkAdapter

from turnlog.engine import Agent, AgentDirectory, AgentSessions, MemoryEventLog, SqliteEventLog, fold, tool
from turnlog.engine.events import AssistantMessage, ToolCallSpec
from turnlog.engine.messages import turn_tool_results
from turnlog.engine.models.base import Model, ModelChunk, ModelRequest, ModelResponse, Usage

AGENT_ID = "support"
USER_ID = "bench-user"
HISTORY_ROLES = frozenset({"user", "assistant", "tool"})


class PeersFakeModel(Model):
    """The peers workload's fake model, plugged in through turnlog's Model hook."""

    name = "peers-fake"

    def __init__(self, k: int, delay_s: float) -> None:
        self.k = k
        self.delay_s = delay_s

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        await W.model_latency(self.delay_s)
        messages = request.messages
        n_tool = len(turn_tool_results(messages))  # tool results after the last user message
        d = W.decide(n_tool, len(messages), self.k)
        if d.kind == "tool":
            call = ToolCallSpec(d.call_id, d.tool_name, json.dumps(d.args))
            yield ModelResponse(text="", tool_calls=(call,), usage=Usage(1, 1), finish_reason="tool_calls")
        else:
            yield ModelResponse(text=d.text, usage=Usage(1, 1), finish_reason="stop")


# workload.lookup is `async def lookup(order_id: str) -> dict` with a docstring: the schema and
# description come from it; idempotent because it is a read-only lookup.
lookup_tool = tool(W.lookup, idempotent=True)


class TurnlogAdapter(FrameworkAdapter):
    name = "turnlog"
    packages = ("fastavro", "jsonschema", "pydantic", "pydantic-core")
    persistence_notes = {
        "sqlite": "engine.SqliteEventLog(file, durability='power'): WAL, synchronous=FULL; every step "
        "commits its events right before each model call and at turn end: K+2 commits per user "
        "turn (user message + turn start + model call started; per tool step: answer + tool call "
        "requested/started + tool result + next model call started; final answer + turn "
        "finished; the idempotent tool needs no commit of its own). The K commits after the "
        "tool's batches are redoable: they return once checked and ordered and share the turn "
        "end's COMMIT (or commit within 5 ms), so 2 fsyncs a turn; the user message and the turn "
        "end return after their fsync. Group commit: concurrent sessions' appends share one "
        "transaction (one WAL fsync). Avro-encoded events",
        "sqlite_normal": "same log with durability='process' (synchronous=NORMAL: no fsync per commit)",
        "memory": "engine.MemoryEventLog(): turnlog's in-memory log, the events kept as Python objects "
        "(no encoding, no SQL), with the same version checks, submissions and partitions",
    }

    async def open(self, persistence: str, db_path: str | None) -> None:
        # TURNLOG_BENCH_PLAIN=1: content encryption off, to measure what it costs (A/B)
        plain = {"encrypt": False} if os.environ.get("TURNLOG_BENCH_PLAIN") else {}
        if db_path is not None and not os.path.exists(db_path):  # the harness removed the log:
            with contextlib.suppress(FileNotFoundError):  # its key store goes too (another run's
                os.remove(db_path.removesuffix(".db") + ".keys.db")  # master key may be gone)
        if persistence == "sqlite":
            self.log = SqliteEventLog(db_path, durability="power", **plain)
        elif persistence == "sqlite_normal":
            self.log = SqliteEventLog(db_path, durability="process", **plain)
        elif persistence == "memory":
            self.log = MemoryEventLog()
        else:
            raise ValueError(persistence)
        agent = Agent(AGENT_ID, PeersFakeModel(self.k, self.model_delay_s), tools=[lookup_tool])
        self.api = AgentSessions(self.log, AgentDirectory([agent]))
        self._created: set[str] = set()

    async def run_turn(self, session_id: str, user_text: str) -> str:
        if session_id not in self._created:
            await self.api.create_session(AGENT_ID, USER_ID, session_id=session_id)
            self._created.add(session_id)
        final: str | None = None
        async for item in self.api.send_user_message(session_id, user_text):
            if isinstance(item, AssistantMessage) and not item.tool_calls:
                final = item.text
        if final is None:
            raise RuntimeError(f"{session_id}: the turn ended without a final assistant message")
        return final

    async def stored_history_len(self, session_id: str) -> int:
        # fold the session from the log itself (not the runner's cache of folded sessions)
        state = fold(session_id, await self.log.read_session(session_id))
        return sum(1 for m in state.messages if m.role in HISTORY_ROLES)

    async def close(self) -> None:
        await self.log.close()
