"""docs/analytics.md stays true: every ```sql block runs in DuckDB over an export of a recorded
run (tools that succeed and fail, a fallback, a loop guard, a session in ERROR), on both
backends, and each named query's answer matches turnlog's own read models."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import duckdb

from tests.export_support import ROOT, every_record, record_run
from tests.test_export import export_all
from turnlog.consumers.analytics import AnalyticsConsumer
from turnlog.consumers.projector import Projector
from turnlog.engine import events as ev
from turnlog.engine.log.base import EventLog
from turnlog.projections.store import ProjectionStore, Row

DOC = ROOT / "docs" / "analytics.md"
_BLOCK = re.compile(r"```sql[^\n]*\n(.*?)```", re.S)
_NAME = re.compile(r"^-- name: (\w+)", re.M)


def sql_blocks() -> list[tuple[str | None, str]]:
    """(name, SQL) of every sql block of the page, in order (the views block has no name)."""
    blocks = []
    for text in _BLOCK.findall(DOC.read_text(encoding="utf-8")):
        name = _NAME.search(text)
        blocks.append((name.group(1) if name else None, text))
    return blocks


def run_page(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Run every block of the page over the export in ``out``; the named ones' rows."""
    db = duckdb.connect()
    answers = {}
    for name, text in sql_blocks():
        text = text.replace("'exports/", f"'{out}/")
        for statement in [s for s in text.split(";") if s.strip()]:
            result = db.execute(statement)
            if name is not None and result.description:
                columns = [d[0] for d in result.description]
                answers[name] = [dict(zip(columns, row, strict=True)) for row in result.fetchall()]
    db.close()
    return answers


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (DuckDB's quantile_cont)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _rows(store: ProjectionStore, table: str) -> list[Row]:
    return store._query(f"SELECT * FROM {table}", [])


async def test_every_query_in_the_docs_matches_the_read_models(
    log: EventLog, store: ProjectionStore, tmp_path: Path
) -> None:
    await record_run(log)
    await Projector(log, store).catch_up()
    analytics = AnalyticsConsumer(log, store)
    await analytics.catch_up()
    out = tmp_path / "exports"
    out.mkdir()
    await export_all(log, out, batch=50)
    answers = run_page(out)
    checks: dict[str, Callable[[list[dict[str, Any]]], None]] = {
        "cost_per_user_and_agent_per_day": lambda rows: _costs(rows, store),
        "tool_failure_rate_by_tool": lambda rows: _tools(rows, store),
        "model_latency_by_model": lambda rows: _latency(rows, store),
        "guard_rate_per_day": lambda rows: _guards(rows, store, analytics),
        "turns_per_session_by_agent": lambda rows: _turns(rows, store),
        "sessions_in_error": lambda rows: _errors(rows, store),
    }
    events = [r.event for r in await every_record(log)]
    checks["fallback_rate_per_day"] = lambda rows: _fallbacks(rows, store, events)
    named = [name for name, _ in sql_blocks() if name]
    assert sorted(named) == sorted(checks), "every query on the page is checked, and only those"
    for name in named:
        assert answers[name], f"{name} answered nothing over the recorded run"
        checks[name](answers[name])


def _costs(rows: list[dict[str, Any]], store: ProjectionStore) -> None:
    sessions = {r["session_id"]: r for r in _rows(store, "sessions")}
    expected: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for call in _rows(store, "model_calls"):
        s = sessions[call["session_id"]]
        totals = expected[(call["day"], s["user_id"], s["agent_id"])]
        for i, column in enumerate(("input_tokens", "output_tokens", "cost_micros")):
            totals[i] += call[column]
        totals[3] += 1
    got = {
        (str(r["day"]), r["user_id"], r["agent_id"]): [
            r["input_tokens"], r["output_tokens"], r["cost_micros"], r["model_calls"],
        ]
        for r in rows
    }  # fmt: skip
    assert got == dict(expected)
    assert all(r["cost_usd"] == r["cost_micros"] / 1e6 for r in rows)
    assert sum(r["cost_micros"] for r in rows) > 0


def _tools(rows: list[dict[str, Any]], store: ProjectionStore) -> None:
    calls: dict[str, list[Row]] = defaultdict(list)
    for call in _rows(store, "tool_calls"):
        calls[call["tool_name"]].append(call)
    got = {r["tool_name"]: (r["calls"], r["failures"], r["refused_by_guard"]) for r in rows}
    assert got == {
        name: (
            len(group),
            sum(c["status"] != "success" for c in group),
            sum((c["error"] or "").startswith("loop guard: ") for c in group),
        )
        for name, group in calls.items()
    }
    by_name = {r["tool_name"]: r for r in rows}
    assert by_name["refund"]["failure_rate"] == 1 and by_name["lookup_order"]["failure_rate"] == 0
    assert by_name["ping"]["refused_by_guard"] == 1


def _latency(rows: list[dict[str, Any]], store: ProjectionStore) -> None:
    latencies: dict[str, list[float]] = defaultdict(list)
    for call in _rows(store, "model_calls"):
        if call["status"] == "ok" and call["purpose"] == "turn":
            latencies[call["model_name"]].append(call["latency_ms"])
    got = {r["model"]: (r["calls"], r["p50_ms"], r["p95_ms"]) for r in rows}
    expected = {m: (len(v), quantile(v, 0.5), quantile(v, 0.95)) for m, v in latencies.items()}
    assert got.keys() == expected.keys()
    for model, (calls, p50, p95) in expected.items():
        assert got[model][0] == calls
        assert abs(got[model][1] - p50) < 1e-9 and abs(got[model][2] - p95) < 1e-9


def _fallbacks(rows: list[dict[str, Any]], store: ProjectionStore, events: list[ev.Event]) -> None:
    """The read models keep no fallback column: the log's ModelFallback events are the truth."""
    fell_back = {(e.session_id, e.turn_id, e.step) for e in events if isinstance(e, ev.ModelFallback)}
    calls = [c for c in _rows(store, "model_calls") if c["purpose"] == "turn"]
    assert (sum(r["model_calls"] for r in rows), sum(r["with_fallback"] for r in rows)) == (
        len(calls),
        sum((c["session_id"], c["turn_id"], c["step"]) in fell_back for c in calls),
    )
    assert sum(r["with_fallback"] for r in rows) > 0


def _guards(rows: list[dict[str, Any]], store: ProjectionStore, analytics: AnalyticsConsumer) -> None:
    turns = _rows(store, "turns")
    assert (sum(r["turns"] for r in rows), sum(r["guard_stops"] for r in rows)) == (
        len(turns),
        sum(t["guard"] is not None for t in turns),
    )
    days = analytics.report(days=2)["days"]  # the analytics group's daily counters
    assert [(str(r["day"]), r["turns"], r["guard_stops"]) for r in rows] == [
        (d["day"], d["turns"], d["guard_stops"]) for d in days
    ]
    assert sum(r["guard_stops"] for r in rows) == 1


def _turns(rows: list[dict[str, Any]], store: ProjectionStore) -> None:
    by_agent: dict[str, list[int]] = defaultdict(list)
    for s in _rows(store, "sessions"):
        by_agent[s["agent_id"]].append(s["turns"])
    got = {r["agent_id"]: (r["sessions"], r["turns"], r["most_in_a_session"]) for r in rows}
    assert got == {a: (len(t), sum(t), max(t)) for a, t in by_agent.items()}


def _errors(rows: list[dict[str, Any]], store: ProjectionStore) -> None:
    in_error = [s for s in _rows(store, "sessions") if s["current_state"] == "ERROR"]
    assert len(in_error) == 1
    expected = []
    for s in in_error:
        last = max(store.rows_of("state_changes", s["session_id"]), key=lambda c: c["version"])
        expected.append((s["session_id"], s["agent_id"], s["user_id"], last["cause"], last["detail"]))
    assert [(r["session_id"], r["agent_id"], r["user_id"], r["cause"], r["why"]) for r in rows] == expected
    assert rows[0]["why"] == "ModelError: ops-model is down for maintenance"
