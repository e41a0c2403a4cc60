#!/usr/bin/env python
"""turnlog engine overhead: what the engine costs around a free model.

    PYTHONPATH=. .venv/bin/python bench/engine_overhead.py            # all three parts
    PYTHONPATH=. .venv/bin/python bench/engine_overhead.py --profile  # + cProfile breakdown

1. overhead: N sessions x T turns x K tool steps (default 20 x 10 x 4, the peers' S1), run one
   after another through ``AgentSessions.send_user_message`` with a zero-latency model and an
   async tool, on SqliteEventLog ``:memory:``, ``durability="process"`` (synchronous=NORMAL)
   and ``durability="power"`` (synchronous=FULL: one fsync per commit). Reported: wall and CPU
   (``time.process_time``) microseconds per model step, commits and fsync-able appends per turn.
   The file logs encrypt content by default (engine.crypto); ``process-plain`` / ``power-plain``
   are the same logs with encryption off (``--persistence process process-plain``).
2. growth: one session of 100 turns x 1 tool step (the peers' S3): mean ms per turn of turns
   1-10 vs 91-100, their ratio, and the least-squares slope of turn time against the history
   items at the start of the turn (microseconds per history item).
3. ``--profile``: the overhead workload once more under cProfile; top functions by tottime
   (microseconds per model step) and the time grouped by area.

The model and tool are the peers' workload (bench/peers, shared/peers-bench): the model counts
the tool results after the last user message and calls ``lookup(order_id="A<i>")`` until K
results are in, then answers "done"; it sets usage so nothing estimates tokens. Everything runs
in this process: each case gets a warm-up (2 turns on a scratch log) and a fresh log; the
reported value is the median over ``--reps`` repetitions, interleaved across cases.
Results: a table on stdout and JSON in bench/results/latest.json (``--out``), with a content hash
of the engine code measured. TURNLOG_ENGINE_DIR=<dir> imports the engine from a snapshot made by
bench/engine_version.py instead of the work tree.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import gc
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENGINE_DIR = Path(os.environ.get("TURNLOG_ENGINE_DIR") or REPO)  # a snapshot (bench/engine_version.py)
for _p in (str(REPO), str(HERE), str(ENGINE_DIR)):
    if _p not in sys.path or _p == str(ENGINE_DIR):
        sys.path.insert(0, _p)

import engine_version  # noqa: E402

from turnlog.engine import Agent, AgentDirectory, AgentSessions, SqliteEventLog, fold, tool  # noqa: E402
from turnlog.engine.events import AssistantMessage, ToolCallSpec  # noqa: E402
from turnlog.engine.messages import turn_tool_results  # noqa: E402
from turnlog.engine.models.base import Model, ModelChunk, ModelRequest, ModelResponse, Usage  # noqa: E402

PERSISTENCE = ("memory", "process", "power", "process-plain", "power-plain")
"""``-plain``: the same log with content encryption off (it is on by default: engine.crypto)."""
DEFAULT_PERSISTENCE = ("memory", "process", "power")
FINAL_TEXT = "done"
AGENT_ID = "bench"
WARMUP_TURNS = 2


# --------------------------------------------------------------------------- workload


@dataclass
class Counters:
    model_calls: int = 0
    tool_calls: int = 0
    appends: int = 0
    first_call_history: list[int] | None = None


COUNTERS = Counters()


class FreeModel(Model):
    """Zero-latency deterministic model: K tool calls, then the final text."""

    name = "free"

    def __init__(self, k: int) -> None:
        self.k = k

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        COUNTERS.model_calls += 1
        messages = request.messages
        n_tool = len(turn_tool_results(messages))
        if n_tool == 0 and COUNTERS.first_call_history is not None:
            COUNTERS.first_call_history.append(len(messages))
        if n_tool < self.k:
            call = ToolCallSpec(f"call_{len(messages)}", "lookup", json.dumps({"order_id": f"A{n_tool}"}))
            yield ModelResponse(text="", tool_calls=(call,), usage=Usage(1, 1), finish_reason="tool_calls")
        else:
            yield ModelResponse(text=FINAL_TEXT, usage=Usage(1, 1))


@tool(idempotent=True)
async def lookup(order_id: str) -> dict:
    """Look up the shipping status of an order."""
    COUNTERS.tool_calls += 1
    return {"order_id": order_id, "status": "delayed", "carrier": "SF"}


def open_log(persistence: str, path: Path | None) -> SqliteEventLog:
    if persistence == "memory":
        return SqliteEventLog(":memory:")
    assert path is not None
    durability, _, plain = persistence.partition("-")
    plain = plain == "plain"
    return SqliteEventLog(path, durability=durability, encrypt=not plain)  # type: ignore[arg-type]


def remove_db(path: Path) -> None:
    keys = path.with_name(f"{path.stem}.keys.db")  # the key store beside an encrypted log
    for base in (path, keys):
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(base) + suffix).unlink(missing_ok=True)


def user_text(session: int, turn: int) -> str:
    return f"[session {session} turn {turn}] Where is my order? Please check every order."


class Bench:
    """One agent on one log; counts appends (commits) without changing what the engine does."""

    def __init__(self, persistence: str, path: Path | None, k: int) -> None:
        self.log = open_log(persistence, path)
        inner = self.log.append

        async def counting_append(events: Any, *, expected_version: int, redoable: bool = False) -> Any:
            COUNTERS.appends += 1
            return await inner(events, expected_version=expected_version, redoable=redoable)

        self.log.append = counting_append  # type: ignore[method-assign]
        agent = Agent(AGENT_ID, FreeModel(k), tools=[lookup])
        self.api = AgentSessions(self.log, AgentDirectory([agent]))

    async def turn(self, sid: str, text: str, first: bool, cold: bool = False) -> None:
        if first:
            await self.api.create_session(AGENT_ID, "bench-user", session_id=sid)
        if cold:  # what a cache miss or a stateless worker pays: fold the session from the log
            self.api.runner.forget(sid)
        final = None
        async for item in self.api.send_user_message(sid, text):
            if isinstance(item, AssistantMessage) and not item.tool_calls:
                final = item.text
        if final != FINAL_TEXT:
            raise AssertionError(f"{sid}: final text {final!r}")

    async def stored_items(self, sid: str) -> int:
        state = fold(sid, await self.log.read_session(sid))  # from the log, not the runner cache
        return len(state.messages)

    async def close(self) -> None:
        await self.log.close()


async def warm_up(persistence: str, db_dir: Path, k: int) -> None:
    path = db_dir / f"engine_overhead_warmup_{persistence}.db"
    remove_db(path)
    b = Bench(persistence, path, k)
    for t in range(WARMUP_TURNS):
        await b.turn("warmup", user_text(-1, t), t == 0)
    await b.close()
    remove_db(path)


async def run_case(
    persistence: str,
    db_dir: Path,
    sessions: int,
    turns: int,
    k: int,
    per_turn: bool = False,
    profiler: cProfile.Profile | None = None,
    cold: bool = False,
) -> dict[str, Any]:
    """One measurement: a fresh log, every session's turns in order, then verification."""
    await warm_up(persistence, db_dir, k)
    path = db_dir / f"engine_overhead_{persistence}.db"
    remove_db(path)
    b = Bench(persistence, path, k)
    for name in ("model_calls", "tool_calls", "appends"):
        setattr(COUNTERS, name, 0)
    COUNTERS.first_call_history = []
    turn_s: list[float] = []
    gc.collect()
    if profiler is not None:
        profiler.enable()
    c0, t0 = time.process_time(), time.perf_counter()
    for s in range(sessions):
        sid = f"sess-{s:04d}"
        for t in range(turns):
            ts = time.perf_counter()
            await b.turn(sid, user_text(s, t), t == 0, cold)
            turn_s.append(time.perf_counter() - ts)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if profiler is not None:
        profiler.disable()
    appends = COUNTERS.appends
    # verification (not timed)
    steps = sessions * turns * (k + 1)
    ipt = 2 * k + 2
    problems = []
    if COUNTERS.model_calls != steps:
        problems.append(f"model calls {COUNTERS.model_calls} != {steps}")
    if COUNTERS.tool_calls != sessions * turns * k:
        problems.append(f"tool calls {COUNTERS.tool_calls} != {sessions * turns * k}")
    want_first = sorted(t * ipt + 1 for _ in range(sessions) for t in range(turns))
    if sorted(COUNTERS.first_call_history) != want_first:
        problems.append("the model was not handed the whole history on some turn")
    for s in range(sessions):
        n = await b.stored_items(f"sess-{s:04d}")
        if n != turns * ipt:
            problems.append(f"sess-{s:04d}: {n} stored items != {turns * ipt}")
            break
    db_bytes = (
        os.path.getsize(path)
        + (os.path.getsize(str(path) + "-wal") if os.path.exists(str(path) + "-wal") else 0)
        if persistence != "memory"
        else 0
    )
    await b.close()
    remove_db(path)
    if problems:
        raise AssertionError("; ".join(problems))
    res: dict[str, Any] = {
        "persistence": persistence,
        "sessions": sessions,
        "turns": turns,
        "k": k,
        "model_steps": steps,
        "wall_s": wall,
        "cpu_s": cpu,
        "wall_us_per_step": wall / steps * 1e6,
        "cpu_us_per_step": cpu / steps * 1e6,
        "ms_per_turn": wall / (sessions * turns) * 1e3,
        "commits_per_turn": appends / (sessions * turns),
        "db_bytes_incl_wal": db_bytes,
    }
    if per_turn:
        ms = [x * 1e3 for x in turn_s]
        res["per_turn_ms"] = ms
    return res


def growth_stats(curve_ms: list[float], k: int) -> dict[str, float]:
    ipt = 2 * k + 2
    xs = [t * ipt for t in range(len(curve_ms))]
    slope, intercept = statistics.linear_regression(xs, curve_ms)
    first, last = statistics.mean(curve_ms[:10]), statistics.mean(curve_ms[-10:])
    return {
        "turns_1_10_ms": first,
        "turns_91_100_ms": last,
        "growth_ratio": last / first,
        "us_per_history_item": slope * 1e3,
        "turn_ms_at_empty_history": intercept,
    }


# --------------------------------------------------------------------------- machine facts


def fdatasync_ms(directory: Path, n: int = 200) -> float:
    """Mean latency of a 4 KiB write + fdatasync in ``directory`` (what one durable commit costs)."""
    fd, name = tempfile.mkstemp(dir=directory, suffix=".tmp")
    try:
        buf = b"x" * 4096
        t0 = time.perf_counter()
        for i in range(n):
            os.pwrite(fd, buf, (i % 16) * 4096)
            os.fdatasync(fd)
        return (time.perf_counter() - t0) / n * 1e3
    finally:
        os.close(fd)
        os.unlink(name)


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import sqlite3

    import fastavro
    import pydantic

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "fastavro": fastavro.__version__,
        "pydantic": pydantic.VERSION,
        "loadavg_at_start": os.getloadavg(),
    }


# --------------------------------------------------------------------------- profile

AREAS = (  # first match wins; matched against "file:function"
    (
        "sqlite3 (C calls: execute/commit/fsync)",
        (
            "sqlite3.Connection",
            "sqlite3.Cursor",
            "method 'execute'",
            "method 'fetchone'",
            "method 'fetchall'",
        ),
    ),
    (
        "Avro codec (fastavro, engine/codec.py, engine/avro.py)",
        ("fastavro", "engine/codec.py", "engine/avro.py"),
    ),
    (
        "event construction (events/, uuid, time)",
        ("engine/events/", "uuid.py", "method 'hex'", "time_ns", "urandom", "<string>:"),
    ),
    ("fold (fold.py, states.py)", ("engine/fold.py", "engine/states.py", "enum.py")),
    (
        "tools (validation, jsonschema, pydantic, json)",
        ("engine/tools", "jsonschema", "referencing", "pydantic", "json/", "rpds"),
    ),
    (
        "turn loop / writer / session API",
        ("engine/turn.py", "engine/writer.py", "engine/session.py", "engine/log/"),
    ),
    (
        "asyncio (tasks, timeouts, gather, wait_for)",
        ("asyncio/", "method 'run_until_complete'", "_asyncio", "contextvars"),
    ),
    ("benchmark driver + fake model", ("engine_overhead.py",)),
)


def _func_label(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    parts = Path(filename).parts
    for anchor in ("engine", "site-packages", "lib"):
        if anchor in parts:
            idx = len(parts) - 1 - parts[::-1].index(anchor)
            short = "/".join(parts[idx + (0 if anchor == "engine" else 1) :])
            break
    else:
        short = Path(filename).name
    return f"{short}:{line}({name})"


def profile_report(profiler: cProfile.Profile, steps: int, top: int) -> dict[str, Any]:
    st = pstats.Stats(profiler)
    entries = []
    total = 0.0
    for func, (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        total += tt
        entries.append(
            {
                "function": _func_label(func),
                "key": f"{func[0]}:{func[2]}",
                "calls": nc,
                "calls_per_step": nc / steps,
                "tottime_us_per_step": tt / steps * 1e6,
                "cumtime_us_per_step": ct / steps * 1e6,
            }
        )
    entries.sort(key=lambda e: e["tottime_us_per_step"], reverse=True)
    areas: dict[str, float] = {}
    for e in entries:
        key = e["key"] + " " + e["function"]
        area = next((name for name, needles in AREAS if any(n in key for n in needles)), "other")
        areas[area] = areas.get(area, 0.0) + e["tottime_us_per_step"]
    by_cum = sorted(
        (e for e in entries if "engine/" in e["key"]), key=lambda e: e["cumtime_us_per_step"], reverse=True
    )
    for e in entries:
        e.pop("key")
    return {
        "profiled_total_us_per_step": total / steps * 1e6,
        "top_tottime": entries[:top],
        "top_engine_cumtime": by_cum[:top],
        "areas_us_per_step": dict(sorted(areas.items(), key=lambda kv: -kv[1])),
    }


def print_profile(rep: dict[str, Any], persistence: str) -> None:
    print(
        f"\n## cProfile, overhead workload on '{persistence}' "
        f"(profiled total {rep['profiled_total_us_per_step']:.0f} us/step; cProfile inflates "
        "call-heavy code, read it as shares)"
    )
    print(f"{'tottime us/step':>15} {'cum us/step':>11} {'calls/step':>10}  function")
    for e in rep["top_tottime"]:
        print(
            f"{e['tottime_us_per_step']:15.1f} {e['cumtime_us_per_step']:11.1f} "
            f"{e['calls_per_step']:10.2f}  {e['function']}"
        )
    print("\nengine functions by cumulative time:")
    for e in rep["top_engine_cumtime"]:
        print(
            f"{e['cumtime_us_per_step']:15.1f} us/step {e['calls_per_step']:6.2f} calls/step  {e['function']}"
        )
    print("\nself time by area:")
    tot = rep["profiled_total_us_per_step"]
    for area, us in rep["areas_us_per_step"].items():
        print(f"{us:15.1f} us/step {us / tot * 100:5.1f}%  {area}")


# --------------------------------------------------------------------------- main


def median_of(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    out = dict(runs[0])
    out.pop("per_turn_ms", None)
    for key in keys:
        out[key] = statistics.median(r[key] for r in runs)
    out["reps"] = len(runs)
    return out


def print_tables(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    print(
        f"\nmachine: {m['nproc']} cpu ({m['cpu']}), Python {m['python']}, SQLite {m['sqlite']}, "
        f"fdatasync {doc['fdatasync_ms']:.3f} ms; engine {doc['engine']['sha256_12']}; "
        f"medians of {doc['args']['reps']} reps"
    )
    ov = doc["overhead"]
    if ov:
        p = next(iter(ov.values()))
        print(
            f"\n## overhead: {p['sessions']} sessions x {p['turns']} turns x {p['k']} tool steps "
            f"= {p['model_steps']} model steps"
        )
        hdr = ("persistence", "wall s", "wall us/step", "cpu us/step", "ms/turn", "commits/turn", "db KB")
        rows = [
            (
                name,
                f"{r['wall_s']:.3f}",
                f"{r['wall_us_per_step']:.0f}",
                f"{r['cpu_us_per_step']:.0f}",
                f"{r['ms_per_turn']:.2f}",
                f"{r['commits_per_turn']:.1f}",
                f"{r['db_bytes_incl_wal'] / 1024:.0f}" if r["db_bytes_incl_wal"] else "-",
            )
            for name, r in ov.items()
        ]
        _table(hdr, rows)
    for part, title in (("growth", "growth"), ("growth_cold", "growth, cache dropped before every turn")):
        _growth_table(doc[part], title)


def _growth_table(gr: dict[str, Any], title: str) -> None:
    if gr:
        p = next(iter(gr.values()))
        print(
            f"\n## {title}: 1 session x {p['turns']} turns x {p['k']} tool step "
            f"({2 * p['k'] + 2} history items per turn)"
        )
        hdr = ("persistence", "t1-10 ms", "t91-100 ms", "ratio", "us/history item", "cpu us/step")
        rows = [
            (
                name,
                f"{r['turns_1_10_ms']:.3f}",
                f"{r['turns_91_100_ms']:.3f}",
                f"{r['growth_ratio']:.2f}x",
                f"{r['us_per_history_item']:.2f}",
                f"{r['cpu_us_per_step']:.0f}",
            )
            for name, r in gr.items()
        ]
        _table(hdr, rows)


def _table(hdr: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *rows, strict=True)]
    print(" | ".join(h.ljust(w) for h, w in zip(hdr, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))


def run_growth(a: argparse.Namespace, p: str, rep: int, doc: dict, *, cold: bool) -> dict:
    """One growth run (one long session), with its stats; cold drops the fold cache every turn."""
    r = asyncio.run(run_case(p, a.db_dir, 1, a.growth_turns, a.growth_k, per_turn=True, cold=cold))
    r["part"], r["rep"] = ("growth_cold" if cold else "growth"), rep
    r.update(growth_stats(r["per_turn_ms"], a.growth_k))
    doc["raw"].append(r)
    label = "cold    " if cold else "growth  "
    print(
        f"[rep {rep}] {label} {p:8s} t1-10 {r['turns_1_10_ms']:.3f}ms t91-100 {r['turns_91_100_ms']:.3f}ms",
        file=sys.stderr,
        flush=True,
    )
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--persistence",
        nargs="+",
        choices=PERSISTENCE,
        default=list(DEFAULT_PERSISTENCE),
        help="logs to measure (default: memory, process, power; -plain: encryption off)",
    )
    ap.add_argument("--sessions", type=int, default=20, help="overhead: sessions (default 20)")
    ap.add_argument("--turns", type=int, default=10, help="overhead: turns per session (default 10)")
    ap.add_argument("--k", type=int, default=4, help="overhead: tool steps per turn (default 4)")
    ap.add_argument("--growth-turns", type=int, default=100, help="growth: turns (default 100, min 20)")
    ap.add_argument("--growth-k", type=int, default=1, help="growth: tool steps per turn (default 1)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per case, median reported (default 3)")
    ap.add_argument("--skip", nargs="*", choices=("overhead", "growth"), default=[], help="parts to skip")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="growth: also run it with the runner's cache of folded sessions dropped before "
        "every turn (a cache miss / stateless worker: the session is folded from the log)",
    )
    ap.add_argument("--profile", action="store_true", help="also run the overhead workload under cProfile")
    ap.add_argument(
        "--profile-persistence",
        choices=PERSISTENCE,
        default="process",
        help="log used for --profile (default process)",
    )
    ap.add_argument("--top", type=int, default=15, help="functions shown by --profile (default 15)")
    ap.add_argument(
        "--db-dir",
        type=Path,
        default=HERE / "results",
        help="where the SQLite files are created (and deleted); default bench/results",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=HERE / "results" / "latest.json",
        help="JSON output (default bench/results/latest.json); '-' = none",
    )
    a = ap.parse_args()
    # the encrypted logs' master key: from the environment, not a key file left in --db-dir
    os.environ.setdefault("TURNLOG_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
    if a.growth_turns < 20:
        ap.error("--growth-turns must be at least 20 (turns 1-10 vs the last 10)")
    a.db_dir.mkdir(parents=True, exist_ok=True)

    doc: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "engine": {**engine_version.fingerprint(ENGINE_DIR), "dir": str(ENGINE_DIR)},
        "fdatasync_ms": fdatasync_ms(a.db_dir),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "overhead": {},
        "growth": {},
        "growth_cold": {},
        "raw": [],
    }
    keys = (
        "wall_s",
        "cpu_s",
        "wall_us_per_step",
        "cpu_us_per_step",
        "ms_per_turn",
        "commits_per_turn",
        "db_bytes_incl_wal",
    )
    ov_runs: dict[str, list[dict]] = {p: [] for p in a.persistence}
    gr_runs: dict[str, list[dict]] = {p: [] for p in a.persistence}
    cold_runs: dict[str, list[dict]] = {p: [] for p in a.persistence}
    for rep in range(a.reps):  # interleaved, so drift on a shared machine hits every case alike
        for p in a.persistence:
            if "overhead" not in a.skip:
                r = asyncio.run(run_case(p, a.db_dir, a.sessions, a.turns, a.k))
                r["part"], r["rep"] = "overhead", rep
                ov_runs[p].append(r)
                doc["raw"].append(r)
                print(
                    f"[rep {rep}] overhead {p:8s} wall {r['wall_s']:.3f}s cpu {r['cpu_us_per_step']:.0f} "
                    "us/step",
                    file=sys.stderr,
                    flush=True,
                )
            if "growth" not in a.skip:
                gr_runs[p].append(run_growth(a, p, rep, doc, cold=False))
            if a.cold and "growth" not in a.skip:
                cold_runs[p].append(run_growth(a, p, rep, doc, cold=True))
    for p in a.persistence:
        if ov_runs[p]:
            doc["overhead"][p] = median_of(ov_runs[p], keys)
        for part, runs in (("growth", gr_runs[p]), ("growth_cold", cold_runs[p])):
            if runs:
                curve = [statistics.median(v) for v in zip(*(r["per_turn_ms"] for r in runs), strict=True)]
                row = median_of(runs, keys)
                row.update(growth_stats(curve, a.growth_k))  # from the median curve, like peers bench.py
                row["per_turn_ms_median"] = curve
                doc[part][p] = row

    print_tables(doc)

    if a.profile:
        prof = cProfile.Profile()
        asyncio.run(run_case(a.profile_persistence, a.db_dir, a.sessions, a.turns, a.k, profiler=prof))
        steps = a.sessions * a.turns * (a.k + 1)
        doc["profile"] = {"persistence": a.profile_persistence, **profile_report(prof, steps, a.top)}
        print_profile(doc["profile"], a.profile_persistence)

    if str(a.out) != "-":
        a.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = a.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(a.out)
        print(f"\nwrote {a.out.relative_to(REPO) if a.out.is_relative_to(REPO) else a.out}")


if __name__ == "__main__":
    main()
