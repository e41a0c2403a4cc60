"""Train the embedded log's zstd dictionary (engine/log/zdict.py) on generated sessions.

    python scripts/train_zdict.py [DICT_ID]

writes ``engine/log/events-<DICT_ID>.zdict`` (default: the id new values are written with).
The sessions are generated here with texts of their own, not taken from any benchmark's
workload, so bench/README.md can measure the dictionary on workloads it was not fitted to. It
runs the whole engine (agents, tools, the SQLite log), which is why it is a script and not part
of engine/log/: the log must not import what writes to it.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import AsyncIterator

import zstandard

from turnlog.engine.agent import Agent, AgentDirectory
from turnlog.engine.events import ToolCallSpec
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.log.sqlite_layout import all_records
from turnlog.engine.log.zdict import DICT_ID, LEVEL, dictionary_path
from turnlog.engine.models.base import Model, ModelChunk, ModelRequest, ModelResponse, Usage
from turnlog.engine.session import AgentSessions
from turnlog.engine.tools import Tool, tool

WORDS = (
    "invoice refund shipment parcel account password reset billing plan upgrade cancel report "
    "weekly revenue region customer ticket priority deploy rollback server latency error retry "
    "calendar meeting tomorrow flight hotel booking seat window aisle price quote discount "
    "the a of to and in for on with is was please could you check my our why when how what"
).split()
TOOL_NAMES = ("search_orders", "get_weather", "create_ticket", "convert")

Sample = bytes | bytearray | memoryview


def sentence(rng: random.Random, lo: int = 4, hi: int = 30) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."


class VariedModel(Model):
    """Answers with 0-3 tool calls before its text, arguments and usage drawn from ``rng``."""

    name = "corpus-model"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        rng = self.rng
        since_user = 0
        for m in reversed(request.messages):
            if m.role == "user":
                break
            since_user += m.role == "tool"
        if since_user < rng.choice([0, 1, 1, 2, 3]):
            name = rng.choice(TOOL_NAMES)
            args = {"query": sentence(rng, 1, 5), "limit": rng.randint(1, 50)}
            spec = ToolCallSpec(f"call_{rng.getrandbits(40):x}", name, json.dumps(args))
            usage = Usage(rng.randint(50, 4000), 20)
            yield ModelResponse(text="", tool_calls=(spec,), usage=usage, finish_reason="tool_calls")
        else:
            yield ModelResponse(text=sentence(rng, 5, 60), usage=Usage(rng.randint(50, 4000), 80))


def corpus_tools(rng: random.Random) -> list[Tool]:
    """Four tools with varied results; one fails a fifth of the time."""

    @tool(idempotent=True)
    async def search_orders(query: str, limit: int = 10) -> dict:
        """Search orders."""
        return {"query": query, "hits": [{"id": f"O-{rng.randint(1, 99999)}", "total": rng.random()}]}

    @tool(idempotent=True)
    async def get_weather(query: str, limit: int = 1) -> dict:
        """Weather."""
        return {"city": query, "celsius": rng.randint(-10, 35)}

    @tool()
    async def create_ticket(query: str, limit: int = 1) -> dict:
        """Open a ticket."""
        if rng.random() < 0.2:
            raise RuntimeError("ticket service unavailable")
        return {"ticket": f"T-{rng.randint(1, 9999)}", "summary": query}

    @tool(idempotent=True)
    def convert(query: str, limit: int = 1) -> str:
        """Convert."""
        return sentence(rng, 2, 10)

    return [search_orders, get_weather, create_ticket, convert]


async def corpus(sessions: int = 24, turns: int = 30, seed: int = 1) -> list[bytes]:
    """Event records of generated sessions: varied texts, 0-3 tool calls a turn over four tools,
    failures, several agents; as the engine writes them (snapshots included)."""
    rng = random.Random(seed)
    model, tools = VariedModel(rng), corpus_tools(rng)
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteEventLog(Path(tmp) / "corpus.db", compress=False)
        agents = [Agent.build(name, model, tools) for name in ("support", "travel", "ops")]
        api = AgentSessions(log, AgentDirectory(agents))
        for s in range(sessions):
            sid = (await api.create_session(agents[s % 3].agent_id, f"user-{s}")).session_id
            for _ in range(rng.randint(turns // 2, turns)):
                async for _item in api.send_user_message(sid, sentence(rng)):
                    pass
        await log.close()
        return _records(Path(tmp) / "corpus.db")


def _records(path: Path) -> list[bytes]:
    db = sqlite3.connect(path)
    try:
        return all_records(db)
    finally:
        db.close()


def train(samples: list[Sample], size: int = 32 * 1024, dict_id: int = DICT_ID) -> bytes:
    """A zstd dictionary of ``size`` bytes for ``samples``."""
    trained = zstandard.train_dictionary(size, samples, dict_id=dict_id, level=LEVEL)
    return trained.as_bytes()


def main() -> None:
    dict_id = int(sys.argv[1]) if len(sys.argv) > 1 else DICT_ID
    samples: list[Sample] = list(asyncio.run(corpus()))
    data = train(samples, dict_id=dict_id)
    path = dictionary_path(dict_id)
    path.write_bytes(data)
    raw = sum(map(len, samples))
    print(f"trained on {len(samples)} events ({raw} bytes); wrote {path.name} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
