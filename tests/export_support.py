"""A recorded run for the export tests: several users' sessions of two agents, with tool calls
that succeed and fail, a model fallback, a loop guard and a session that ends in ERROR, run
through the engine on any log; and the exported datasets read back with pyarrow."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads

from turnlog.engine import Agent, AgentDirectory, AgentSessions, FunctionModel, ToolFailure, call, reply, tool
from turnlog.engine.errors import ModelError
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.models.base import ModelRequest, ModelResponse, Usage
from turnlog.engine.models.fallback import FallbackModel
from turnlog.engine.models.pricing import Price, PriceTable
from turnlog.projections.export_rows import DATASETS

ROOT = Path(__file__).resolve().parent.parent


@tool(idempotent=True)
async def lookup_order(order_id: str) -> str:
    """Where an order is."""
    return f"order {order_id}: in transit"


@tool
async def refund(order_id: str) -> str:
    """Refund an order."""
    raise ToolFailure(f"order {order_id} cannot be refunded: already delivered")


@tool(idempotent=True)
async def ping(host: str) -> str:
    """Ping a host."""
    return f"{host} answers"


def _last_user(request: ModelRequest) -> str:
    return next(m.content for m in reversed(request.messages) if m.role == "user")


def _usage(request: ModelRequest, output: int) -> Usage:
    return Usage(10 * len(request.messages), output)


def support_primary(request: ModelRequest) -> ModelResponse | str:
    if "flaky" in _last_user(request):
        raise ModelError("main-model answered 503")
    return support_backup(request)


def support_backup(request: ModelRequest) -> ModelResponse | str:
    if request.messages[-1].role == "user":
        return reply("", call("lookup_order", {"order_id": "A1"}), call("refund", {"order_id": "A1"}))
    return ModelResponse(text="Your order is in transit; it cannot be refunded.", usage=_usage(request, 12))


def ops_model(request: ModelRequest) -> ModelResponse | str:
    text = _last_user(request)
    if "explode" in text:
        raise ModelError("ops-model is down for maintenance")
    if "loop" in text and request.tools:
        return reply("", call("ping", {"host": "db1"}))  # the same call until a guard stops it
    return ModelResponse(text="All hosts answer.", usage=_usage(request, 5))


PRICES = PriceTable(
    {
        "main-model": Price(Decimal(3), Decimal("0.3"), Decimal(15)),
        "backup-model": Price(Decimal(1), Decimal("0.1"), Decimal(4)),
        "ops-model": Price(Decimal(2), Decimal("0.2"), Decimal(8)),
    }
)


def agents() -> AgentDirectory:
    chain = FallbackModel(
        FunctionModel(support_primary, name="main-model"), FunctionModel(support_backup, name="backup-model")
    )
    return AgentDirectory(
        [
            Agent.build("support", chain, [lookup_order, refund], prices=PRICES),
            Agent.build("ops", FunctionModel(ops_model, name="ops-model"), [ping], prices=PRICES),
        ]
    )


SCRIPT = [
    ("support", "u1", ["where is my order?", "refund it please"]),
    ("support", "u2", ["flaky: where is my order?"]),
    ("ops", "u1", ["are the hosts up?", "loop: ping db1 until it answers"]),
    ("ops", "u3", ["explode the cache"]),
    ("support", "u3", ["where is order A1?", "flaky: and now?", "thanks"]),
]


async def record_run(log: EventLog) -> list[str]:
    """Run ``SCRIPT`` on ``log`` through the engine; return the session ids."""
    api = AgentSessions(log, agents())
    sessions = []
    for agent_id, user, messages in SCRIPT:
        sid = (await api.create_session(agent_id, user)).session_id
        sessions.append(sid)
        for text in messages:
            async for _ in api.send_user_message(sid, text):
                pass
    return sessions


async def every_record(log: EventLog) -> list[LogRecord]:
    found = []
    for p in range(log.partitions):
        offset = 0
        while records := await log.read_partition(p, offset, 1000):
            found += records
            offset = records[-1].offset + 1
    return found


def read_dataset(out: Path, name: str) -> list[dict[str, Any]]:
    """Every row of an exported dataset, as dicts (``day`` from the folder included)."""
    folder = out / name
    if not folder.exists():
        return []
    table = pads.dataset(folder, format="parquet", partitioning="hive").to_table()
    return table.to_pylist()


def exported_keys(out: Path) -> dict[str, list[tuple[str, int]]]:
    """(session_id, version) of every row, per dataset (a ToolCallFinished is in two)."""
    return {
        name: sorted((r["session_id"], r["version"]) for r in read_dataset(out, name)) for name in DATASETS
    }


def turnlog_cli(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    """``turnlog ARGS`` as a child process of this checkout's interpreter."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.Popen(
        [sys.executable, "-m", "turnlog", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )
