#!/usr/bin/env python
"""Tokens sent per turn against turn number, and what compaction costs (issue 8, section 7).

    PYTHONPATH=. .venv/bin/python bench/context_budget.py                # 300 turns, 8K window
    PYTHONPATH=. .venv/bin/python bench/context_budget.py --turns 600 --window 16000

One session on a ``durability="process"`` SQLite log, driven through ``send_user_message`` by a
free rule model: most turns are a plain question and a ~90-token answer; every 5th turn calls a
lookup tool whose result is ~400 tokens; every 9th is small talk. The agent's context is
``ContextPolicy(window=W, summarizer="extractive")`` (no model, so the timings are the engine's
own; a model summariser adds its own call).

Reported:

* tokens sent: the history section of each model call (``ModelCallStarted.section_tokens_json``,
  counted with tiktoken cl100k_base) and the whole request's estimate, averaged per bucket of
  turns: flat once the history budget is reached, where it saws between the 50 % a summary cuts
  it down to and the 90 % summary threshold;
* summaries: how many, and how many turns apart (the summariser's calls with a model);
* compaction: every ``ContextManager.fit`` call is timed: p50/p95 when it changed nothing (the
  per-step check), when it trimmed, and when it summarised;
* turn time per bucket (wall ms): does not grow with the session's length.

Results: a table on stdout and JSON in bench/results/context.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import engine_version  # noqa: E402

from turnlog.engine import (  # noqa: E402
    Agent,
    AgentDirectory,
    AgentSessions,
    ContextPolicy,
    FunctionModel,
    SqliteEventLog,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev  # noqa: E402
from turnlog.engine.models.base import ModelRequest, ModelResponse  # noqa: E402

ANSWER = (
    "I checked the deliveries in this batch against the carrier's scans and the customer notes; "
    "two parcels are a day late, the rest arrived as planned, and no customer asked for a refund. "
) * 2
RESULT = {"rows": [{"order": f"A-{i}", "status": "late", "days": i % 7, "carrier": "DHL"} for i in range(40)]}


@tool(idempotent=True)
async def lookup(batch: int) -> dict[str, Any]:
    """Look up one batch of deliveries."""
    return RESULT


def answer(request: ModelRequest) -> ModelResponse | str:
    last = request.messages[-1]
    if last.role == "tool":
        return "The lookup shows two late parcels in this batch."
    text = next(m.content for m in reversed(request.messages) if m.role == "user")
    if text.startswith("Look up"):
        return reply("", call("lookup", {"batch": int(text.split()[-1])}))
    return "You're welcome." if text == "thanks!" else ANSWER


def question(turn: int) -> str:
    if turn % 9 == 8:
        return "thanks!"
    if turn % 5 == 4:
        return f"Look up batch {turn}"
    return f"Check the next batch of deliveries for late parcels, batch {turn}."


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(turns: int, window: int, bucket: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteEventLog(Path(tmp) / "log.db", durability="process")
        policy = ContextPolicy(window=window, summarizer="extractive")
        agent = Agent("bench", FunctionModel(answer, name="free"), [lookup], context=policy)
        api = AgentSessions(log, AgentDirectory([agent]))
        sid = (await api.create_session("bench", "u")).session_id
        fits: list[float] = []  # ms per ContextManager.fit call, in call order
        manager = api.runner.context
        original = manager.fit

        async def timed_fit(w: Any, a: Any, step: int, *, force: str = "") -> bool:
            started = time.perf_counter()
            changed = await original(w, a, step, force=force)
            fits.append((time.perf_counter() - started) * 1000)
            return changed

        manager.fit = timed_fit  # type: ignore[method-assign]
        turn_ms: list[float] = []
        for turn in range(turns):
            started = time.perf_counter()
            async for _ in api.send_user_message(sid, question(turn)):
                pass
            turn_ms.append((time.perf_counter() - started) * 1000)
            if (turn + 1) % 100 == 0:
                print(f"  {turn + 1}/{turns} turns", file=sys.stderr)
        events = await log.read_session(sid)
        await log.close()
    return report(events, fits, turn_ms, turns, bucket, policy.budgets(agent.model).history, window)


def report(
    events: list[ev.Event],
    fits: list[float],
    turn_ms: list[float],
    turns: int,
    bucket: int,
    budget: int,
    window: int,
) -> dict[str, Any]:
    per_turn: dict[str, list[int]] = {}
    starts = [e for e in events if isinstance(e, ev.ModelCallStarted)]
    for e in starts:
        per_turn.setdefault(e.turn_id, []).append(json.loads(e.section_tokens_json)["history"])
    order = list(dict.fromkeys(e.turn_id for e in starts))
    history_first_call = [per_turn[t][0] for t in order]
    estimated = {e.turn_id: sum(json.loads(e.section_tokens_json).values()) for e in reversed(starts)}
    buckets = []
    for i in range(0, turns, bucket):
        ids = order[i : i + bucket]
        buckets.append(
            {
                "turns": f"{i + 1}-{i + len(ids)}",
                "history_tokens_mean": round(statistics.mean(history_first_call[i : i + bucket]), 1),
                "request_tokens_mean": round(statistics.mean(estimated[t] for t in ids), 1),
                "turn_ms_median": round(statistics.median(turn_ms[i : i + bucket]), 2),
            }
        )
    summaries = [e for e in events if isinstance(e, ev.HistorySummarized)]
    trims = [e for e in events if isinstance(e, ev.ContextTrimmed)]
    turn_no = {t: i + 1 for i, t in enumerate(order)}
    summary_turns = sorted({turn_no[e.turn_id] for e in summaries if e.turn_id in turn_no})
    gaps = [b - a for a, b in zip(summary_turns, summary_turns[1:], strict=False)]
    summary_steps = {(e.turn_id, e.step) for e in summaries}
    trim_steps = {(e.turn_id, e.step) for e in trims} - summary_steps
    # fits are in call order; pair them with (turn, step) of the ModelCallStarted that followed
    kinds = []
    for ms, started in zip(fits, starts, strict=False):
        key = (started.turn_id, started.step)
        kinds.append(
            ("summarised" if key in summary_steps else "trimmed" if key in trim_steps else "no-op", ms)
        )
    compaction = {
        kind: {
            "count": len(v := [ms for k, ms in kinds if k == kind]),
            "p50_ms": round(pct(v, 0.5), 3),
            "p95_ms": round(pct(v, 0.95), 3),
        }
        for kind in ("no-op", "trimmed", "summarised")
    }
    return {
        "engine": engine_version.fingerprint()["sha256_12"],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "window": window,
        "history_budget": budget,
        "turns": turns,
        "max_history_tokens_sent": max(history_first_call),
        "summaries": len(summaries),
        "trims": len(trims),
        "first_summary_turn": summary_turns[0] if summary_turns else None,
        "turns_between_summaries": {
            "min": min(gaps, default=0),
            "median": statistics.median(gaps) if gaps else 0,
            "mean": round(statistics.mean(gaps), 1) if gaps else 0,
        },
        "buckets": buckets,
        "compaction": compaction,
    }


def show(result: dict[str, Any]) -> None:
    print(
        f"\nwindow {result['window']}, history budget {result['history_budget']} tokens, "
        f"{result['turns']} turns, {result['summaries']} summaries, {result['trims']} trims, "
        f"largest history sent {result['max_history_tokens_sent']} tokens (engine {result['engine']})"
    )
    between = result["turns_between_summaries"]
    print(
        f"first summary at turn {result['first_summary_turn']}; turns between summaries: "
        f"min {between['min']}, median {between['median']}, mean {between['mean']}"
    )
    print("\n| turns | history tokens sent (mean) | request tokens (mean) | turn wall ms (median) |")
    print("|---|---|---|---|")
    for b in result["buckets"]:
        row = (b["turns"], b["history_tokens_mean"], b["request_tokens_mean"], b["turn_ms_median"])
        print("| " + " | ".join(str(v) for v in row) + " |")
    print("\n| fit() before a model call | count | p50 ms | p95 ms |")
    print("|---|---|---|---|")
    for kind, v in result["compaction"].items():
        print(f"| {kind} | {v['count']} | {v['p50_ms']} | {v['p95_ms']} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--bucket", type=int, default=25)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "context.json")
    args = parser.parse_args()
    result = asyncio.run(run(args.turns, args.window, args.bucket))
    show(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
