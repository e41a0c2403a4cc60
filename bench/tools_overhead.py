"""Tool-layer overhead: argument validation per call, and one model step with 8 parallel calls.

    PYTHONPATH=. .venv/bin/python bench/tools_overhead.py            # ~20 s
    PYTHONPATH=. .venv/bin/python bench/tools_overhead.py --reps 5 --out -

* validation: µs per ``parse_arguments`` call, valid and invalid, for a tool built from a typed
  function (pydantic fast path) and for a JSON Schema tool (the MCP path), plus the loop guards'
  ``canonical_arguments`` and the role view lookup that every call now pays.
* parallel step: whole turns through ``AgentSessions.send_user_message`` on an in-memory log,
  where the model asks for N calls of a no-op async tool in one step and then answers. Reported
  as ms per turn for N = 1 and N = 8 and the engine cost per extra call. A second case uses a
  tool that sleeps 50 ms: 8 calls in one step take about one sleep, not eight, if they overlap.

Validation reports the best of ``--reps`` (like timeit: other load only adds time), the parallel
step the median; JSON goes to bench/results/tools.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from turnlog.engine import (  # noqa: E402
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    SqliteEventLog,
    Tool,
    ToolRegistry,
    Usage,
    call,
    tool,
)
from turnlog.engine.messages import turn_tool_results  # noqa: E402
from turnlog.engine.tools import parse_arguments  # noqa: E402
from turnlog.engine.tools.guards import canonical_arguments  # noqa: E402
from turnlog.engine.tools.permissions import tools_for_role  # noqa: E402

HERE = Path(__file__).resolve().parent


@tool
def book(day: datetime.date, seats: int, cabin: Literal["economy", "business"] = "economy") -> str:
    """Book seats."""
    return "ok"


SCHEMA_TOOL = Tool(
    name="notify",
    description="JSON Schema tool",
    parameters={
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email"},
            "at": {"type": "string", "format": "date-time"},
            "channel": {"enum": ["mail", "sms"]},
        },
        "required": ["email", "at"],
        "additionalProperties": False,
    },
    handler=lambda **kw: "sent",
)
VALIDATION_CASES: dict[str, tuple[Tool, str]] = {
    "typed, valid": (book, '{"day": "2025-01-15", "seats": 2}'),
    "typed, invalid (3 problems)": (book, '{"day": "15.01.2025", "seats": "two", "cabin": "first"}'),
    "schema, valid": (SCHEMA_TOOL, '{"email": "a@b.io", "at": "2025-01-15T09:30:00Z", "channel": "sms"}'),
    "schema, invalid (3 problems)": (SCHEMA_TOOL, '{"email": "nope", "at": "tomorrow", "channel": "fax"}'),
}


def per_call_us(fn: Callable[[], Any], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def bench_validation(reps: int, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    registry = ToolRegistry([book, SCHEMA_TOOL])
    cases: dict[str, Callable[[], Any]] = {
        name: (lambda t=t, raw=raw: parse_arguments(t, raw)) for name, (t, raw) in VALIDATION_CASES.items()
    }
    cases["guards: canonical_arguments (uncached)"] = lambda: canonical_arguments.__wrapped__(
        '{"day": "2025-01-15", "seats": 2}'
    )
    cases["permissions: role view lookup"] = lambda: tools_for_role(registry, "user")
    for name, fn in cases.items():
        fn()  # warm caches
        out[name] = min(per_call_us(fn, n) for _ in range(reps))  # timeit's rule: noise only adds
    return out


def parallel_agent(n_calls: int, sleep_s: float) -> Agent:
    @tool(idempotent=True)
    async def lookup(order_id: str) -> dict:
        """Look up an order."""
        await asyncio.sleep(sleep_s)
        return {"order_id": order_id}

    usage = Usage(10, 10)  # set, so the fake model does not estimate tokens (not engine time)

    def fn(request: ModelRequest) -> Any:
        if turn_tool_results(request.messages):
            return ModelResponse("done", usage=usage)
        calls = tuple(call("lookup", {"order_id": f"A{i}"}, f"c{i}") for i in range(n_calls))
        return ModelResponse("", calls, usage, "tool_calls")

    return Agent.build("bench", FunctionModel(fn), [lookup])


async def turn_ms(n_calls: int, sleep_s: float, turns: int) -> float:
    log = SqliteEventLog(":memory:")
    api = AgentSessions(log, AgentDirectory([parallel_agent(n_calls, sleep_s)]))
    sid = (await api.create_session("bench", "u")).session_id
    async for _ in api.send_user_message(sid, "warm up"):
        pass
    started = time.perf_counter()
    for i in range(turns):
        async for _ in api.send_user_message(sid, f"turn {i}"):
            pass
    elapsed = (time.perf_counter() - started) / turns * 1000
    await log.close()
    return elapsed


def bench_parallel(reps: int, turns: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {"1 call": [], "8 calls": [], "8 calls x 50 ms sleep": []}
    for _ in range(reps):  # interleaved
        runs["1 call"].append(asyncio.run(turn_ms(1, 0.0, turns)))
        runs["8 calls"].append(asyncio.run(turn_ms(8, 0.0, turns)))
        runs["8 calls x 50 ms sleep"].append(asyncio.run(turn_ms(8, 0.05, max(5, turns // 20))))
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["engine cost per extra call"] = (out["8 calls"] - out["1 call"]) / 7
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5000, help="validation calls per rep and case")
    ap.add_argument("--turns", type=int, default=100, help="turns per rep for the parallel step")
    ap.add_argument("--out", default=str(HERE / "results" / "tools.json"), help="JSON output; '-' = none")
    a = ap.parse_args()
    validation = bench_validation(a.reps, a.calls)
    parallel = bench_parallel(a.reps, a.turns)
    print("| validation case | µs per call |\n|---|---:|")
    for name, us in validation.items():
        print(f"| {name} | {us:.1f} |")
    print("\n| parallel step (whole turn: 2 model calls + 1 tool step) | ms per turn |\n|---|---:|")
    for name, ms in parallel.items():
        print(f"| {name} | {ms:.3f} |")
    if a.out != "-":
        doc = {
            "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "python": sys.version.split()[0],
            "reps": a.reps,
            "load_average_1m": os.getloadavg()[0],
            "validation_us": validation,
            "parallel_ms": parallel,
        }
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
