"""Experiments (engine.experiments, `turnlog experiment`): 20 demo sessions recorded with the
scripted model and replayed against candidate agents (tests/agentpkg/experiments.py).

* the same agent: zero divergences (embedded, and on Kafka with PostgreSQL projections, where
  the replays stay out of the production listings and analytics);
* a model that skips one notification: exactly the task turns differ (the notice missing, the
  report written with other arguments and not run, the answer changed), nothing else;
* a model that sends the notices with another text: the write tool is never run, and reported;
* a `turnlog experiment run` process SIGKILLed midway: resumed, no finished session is
  replayed again and no message is posted twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentpkg import experiments as candidates
from tests.services import kafka_log, need_service, postgres_store
from turnlog.consumers import Projector
from turnlog.engine import AgentDirectory, AgentSessions, SqliteEventLog
from turnlog.engine import events as ev
from turnlog.engine.experiments import (
    UNMATCHED_ERROR,
    ExperimentRunner,
    Selection,
    is_experiment_session,
    list_experiments,
    load_spec,
)
from turnlog.engine.experiments.compare import ExperimentReport
from turnlog.engine.experiments.namespace import replay_id
from turnlog.engine.experiments.report import report_json
from turnlog.engine.experiments.runner import Progress
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.examples.logistics import TASK, LogisticsBackend, build_agent
from turnlog.projections import SqliteProjectionStore, queries
from turnlog.projections.analytics import AnalyticsStore

REPO = Path(__file__).resolve().parent.parent
LOOKUP = "Which orders had logistics anomalies last week?"
SCRIPTS = ([TASK], [LOOKUP], [LOOKUP, TASK], [TASK, LOOKUP])
"""What the recorded sessions ask, in turn order (session i asks SCRIPTS[i % 4])."""
SESSIONS = 20
RECORDED_REPORTS = Path(os.environ.get("TMPDIR", "/tmp")) / "experiment-recorded-reports"


async def record(log: EventLog, n: int = SESSIONS) -> dict[str, list[str]]:
    """``n`` demo sessions run by the scripted model; their ids and what each turn asked."""
    backend = LogisticsBackend(today=candidates.TODAY, reports_dir=RECORDED_REPORTS)
    agents = AgentDirectory([build_agent(candidates.recorded_model(), backend)])
    api = AgentSessions(log, agents, producer="recorder")
    asked: dict[str, list[str]] = {}
    for i in range(n):
        session = await api.create_session("logistics-assistant", f"user-{i % 3}")
        for text in SCRIPTS[i % len(SCRIPTS)]:
            async for _ in api.send_user_message(session.session_id, text):
                pass
        asked[session.session_id] = list(SCRIPTS[i % len(SCRIPTS)])
    return asked


async def experiment(log: EventLog, target: str, **options: Any) -> tuple[ExperimentRunner, ExperimentReport]:
    runner = ExperimentRunner(log, getattr(candidates, target)())
    spec = await runner.define(Selection(), candidate=f"tests.agentpkg.experiments:{target}", **options)
    return runner, await runner.run(spec)


@pytest.fixture
async def sqlite_log(tmp_path: Path) -> AsyncIterator[SqliteEventLog]:
    log = SqliteEventLog(tmp_path / "log.db", partitions=4)
    try:
        yield log
    finally:
        await log.close()


async def test_same_agent_reports_zero_divergences(sqlite_log: SqliteEventLog, tmp_path: Path) -> None:
    asked = await record(sqlite_log)
    runner, report = await experiment(sqlite_log, "same", concurrency=6)
    summary = report.summary()
    assert summary["sessions"] == SESSIONS and summary["sessions_complete"] == SESSIONS
    assert summary["turns_replayed"] == sum(len(t) for t in asked.values())
    assert summary["sessions_divergent"] == summary["turns_divergent"] == 0
    assert summary["calls_unmatched"] == summary["answers_differ"] == summary["outcomes_differ"] == 0
    assert summary["input_tokens"]["delta"] == summary["output_tokens"]["delta"] == 0
    # every replay is a session of its own in the experiment namespace, with the recorded messages
    for origin, texts in asked.items():
        rid = replay_id(report.experiment_id, origin)
        events = await sqlite_log.read_session(rid)
        assert is_experiment_session(rid)
        assert [e.text for e in events if isinstance(e, ev.UserMessageReceived)] == texts
        assert [e.reason for e in events if isinstance(e, ev.TurnFinished)] == ["answered"] * len(texts)
    # listed by the log, with its definition; its replays kept out of production reads
    listed = await list_experiments(sqlite_log)
    assert [s.experiment_id for s in listed] == [report.experiment_id]
    assert sorted(listed[0].sessions) == sorted(asked)
    store = SqliteProjectionStore(tmp_path / "projections.db")
    try:
        await Projector(sqlite_log, store).catch_up()
        assert {r["session_id"] for r in store.sessions(1000)} == set(asked)
        assert {r["session_id"] for r in queries.list_sessions(store, limit=1000)} == set(asked)
        assert sum(queries.state_counts(store).values()) == SESSIONS
        replay = replay_id(report.experiment_id, next(iter(asked)))
        assert store.session(replay) is not None and store.rows_of("messages", replay)  # inspectable
        analytics = AnalyticsStore(store)
        await analytics.apply_async(await _all_records(sqlite_log))
        assert sum(r["sessions"] for r in analytics.daily("2000-01-01")) == SESSIONS
    finally:
        store.close()
    # the report is made again from the log alone, identical
    again = await ExperimentRunner(sqlite_log).report(await load_spec(sqlite_log, report.experiment_id))
    assert report_json(again) == report_json(report)


async def _all_records(log: EventLog) -> list[LogRecord]:
    records = []
    for p in range(log.partitions):
        records += await log.read_partition(p, 0, 100_000)
    return records


async def test_a_model_that_skips_a_notice_changes_exactly_the_task_turns(sqlite_log: SqliteEventLog) -> None:
    asked = await record(sqlite_log)
    _, report = await experiment(sqlite_log, "skips_notice")
    expected = {(sid, i) for sid, texts in asked.items() for i, text in enumerate(texts) if text == TASK}
    found = {(s.origin_session_id, t.index) for s in report.sessions for t in s.divergent_turns}
    assert found == expected
    assert {s.origin_session_id for s in report.divergent_sessions} == {sid for sid, _ in expected}
    for s in report.sessions:
        for t in s.divergent_turns:
            assert [name for name, _ in t.missing] == ["send_notification"]
            assert t.added == []
            assert [name for name, _, _ in t.changed] == ["save_report"]  # its body counts one notice less
            assert [name for name, _ in t.unmatched] == ["save_report"]  # not idempotent: not run
            assert t.answer_original.startswith("Last week had") and t.answer_replay != t.answer_original
            assert 0 < t.similarity < 1
            assert t.outcome_original == t.outcome_replay == "answered"
    summary = report.summary()
    assert summary["turns_divergent"] == len(expected)
    assert summary["calls_missing"] == summary["calls_changed"] == summary["calls_unmatched"] == len(expected)
    assert candidates.BACKEND.outbox == []
    assert not candidates.BACKEND.reports_dir.exists() or not any(candidates.BACKEND.reports_dir.glob("*.md"))


async def test_a_model_stopped_by_a_loop_guard_is_a_different_outcome(sqlite_log: SqliteEventLog) -> None:
    await record(sqlite_log, 2)
    _, report = await experiment(sqlite_log, "loops")
    turns = [t for s in report.sessions for t in s.turns]
    assert turns and all(t.outcome_original == "answered" for t in turns)
    assert all(t.outcome_replay != "answered" and t.outcome_differs and t.divergent for t in turns)
    assert all("repeated_call" in t.outcome_replay for t in turns), [t.outcome_replay for t in turns]
    assert report.summary()["outcomes_differ"] == len(turns)


async def test_a_write_tool_with_other_arguments_is_never_run_and_is_reported(
    sqlite_log: SqliteEventLog,
) -> None:
    asked = await record(sqlite_log, 4)
    _, report = await experiment(sqlite_log, "other_message")
    assert candidates.BACKEND.outbox == []  # no notice was sent by the experiment
    task_turns = [t for s in report.sessions for t in s.turns if t.user_text == TASK]
    assert len(task_turns) == sum(texts.count(TASK) for texts in asked.values())
    for t in task_turns:
        changed = [(name, json.loads(old), json.loads(new)) for name, old, new in t.changed]
        notices = [c for c in changed if c[0] == "send_notification"]
        assert notices and all(old["message"].startswith("We are sorry") for _, old, _ in notices)
        assert all(new["message"].startswith("Apologies") for _, _, new in notices)
        assert [n for n, _ in t.unmatched].count("send_notification") == len(notices)
        assert t.divergent
    for s in report.sessions:
        for e in await sqlite_log.read_session(s.replay_session_id):
            if isinstance(e, ev.ToolCallFinished) and e.tool_name == "send_notification":
                assert e.status == "failed" and (e.error or "").startswith(UNMATCHED_ERROR)
                assert UNMATCHED_ERROR in e.content  # the model reads the marker
    rendered = report_json(report)
    first = next(s for s in rendered["sessions"] if s["turn_diffs"])
    assert first["turn_diffs"][0]["tool_calls"]["unmatched"][0]["tool"] == "send_notification"


async def test_only_idempotent_tools_run_live_and_only_when_asked(sqlite_log: SqliteEventLog) -> None:
    """A candidate whose query has other arguments: unmatched and not run by default; run live
    (a real result) with live=['query_orders']; send_notification is never live."""
    from turnlog.engine.experiments.tool_server import RecordedTools

    await record(sqlite_log, 4)

    async def query_results(live: list[str]) -> list[ev.ToolCallFinished]:
        _, report = await experiment(sqlite_log, "wider_query", live=live)
        finished = []
        for s in report.sessions:
            events = await sqlite_log.read_session(s.replay_session_id)
            finished += [e for e in events if isinstance(e, ev.ToolCallFinished)]
        # the first query's slashed dates are refused by validation before anything answers it
        return [e for e in finished if e.tool_name == "query_orders" and e.status != "rejected"]

    recorded_only = await query_results([])
    assert recorded_only and all((e.error or "").startswith(UNMATCHED_ERROR) for e in recorded_only)
    ran_live = [e for e in await query_results(["query_orders"]) if e.status == "success"]
    assert ran_live and all(UNMATCHED_ERROR not in e.content for e in ran_live)
    assert all("between 2026-11-22 and" in e.content for e in ran_live)  # the wider window: live
    assert candidates.BACKEND.outbox == []  # a notice is never live, matched or not

    agent = next(iter(candidates.same()))
    tools = {t.name: t for t in agent.tools}
    assert RecordedTools(["query_orders"]).may_run_live(tools["query_orders"])
    assert not RecordedTools(["send_notification"]).may_run_live(tools["send_notification"])
    assert not RecordedTools(True).may_run_live(tools["save_report"])
    assert not RecordedTools().may_run_live(tools["query_orders"])


def _experiment_cli(home: Path, *args: str, env: dict[str, str], output: Path) -> subprocess.Popen[bytes]:
    """`turnlog experiment ...` in a process of its own, its output to ``output``."""
    with output.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "turnlog", "experiment", *args, "--home", str(home)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **env},
            cwd=REPO,
        )


async def test_an_experiment_killed_midway_resumes_without_repeating_finished_sessions(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    log = SqliteEventLog(home / "log.db", partitions=8)  # the CLI's embedded log
    try:
        asked = await record(log)
    finally:
        await log.close()
    marker = tmp_path / "hung"
    hang = {"TURNLOG_EXPERIMENT_HANG_AFTER": "40", "TURNLOG_EXPERIMENT_HANG_FILE": str(marker)}
    proc = _experiment_cli(
        home,
        "run",
        "--candidate",
        "tests.agentpkg.experiments:hangs",
        "--concurrency",
        "2",
        env=hang,
        output=tmp_path / "run.out",
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():  # the model has answered 40 calls and hangs: kill it there
            if proc.poll() is not None:
                pytest.fail(f"the experiment ended before it hung: {(tmp_path / 'run.out').read_text()}")
            assert time.monotonic() < deadline, "the experiment never reached its 40th model call"
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = SqliteEventLog(home / "log.db", partitions=8)
    try:
        [spec] = await list_experiments(log)
        before = {sid: await log.session_version(replay_id(spec.experiment_id, sid)) for sid in asked}
        finished = {
            sid
            for sid in asked
            if _done(await log.read_session(replay_id(spec.experiment_id, sid)), asked[sid])
        }
        assert 0 < len(finished) < SESSIONS  # killed midway
        assert any(v and sid not in finished for sid, v in before.items())  # and one in the middle of a turn
        seen: list[Progress] = []
        runner = ExperimentRunner(log, candidates.same(), on_progress=seen.append)
        report = await runner.resume(spec.experiment_id)
        assert {p.origin_session_id for p in seen if p.skipped} == finished
        for sid in finished:  # not replayed again: not one event more
            assert await log.session_version(replay_id(spec.experiment_id, sid)) == before[sid]
        for sid, texts in asked.items():  # every message posted once, every turn run once
            events = await log.read_session(replay_id(spec.experiment_id, sid))
            assert [e.text for e in events if isinstance(e, ev.UserMessageReceived)] == texts
            assert len([e for e in events if isinstance(e, ev.TurnStarted)]) == len(texts)
            assert _done(events, texts)
        summary = report.summary()
        assert summary["sessions_complete"] == SESSIONS
        assert summary["sessions_divergent"] == 0  # the same model: the resumed turns too
    finally:
        await log.close()
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnlog",
            "experiment",
            "report",
            spec.experiment_id,
            "--json",
            "--home",
            str(home),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["summary"]["sessions_complete"] == SESSIONS
    for args, expected in ((["report", spec.experiment_id], "sessions divergent"), (["list"], "hangs")):
        table = subprocess.run(
            [sys.executable, "-m", "turnlog", "experiment", *args, "--home", str(home)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
            cwd=REPO,
            timeout=120,
        )
        assert table.returncode == 0, table.stderr
        assert spec.experiment_id in table.stdout and expected in table.stdout  # the terminal tables


def _done(events: list[ev.Event], texts: list[str]) -> bool:
    return len([e for e in events if isinstance(e, ev.TurnFinished)]) == len(texts)


async def test_replay_on_kafka_with_postgres_projections() -> None:
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    dsn = need_service("TURNLOG_POSTGRES_DSN")
    async with kafka_log(bootstrap) as log:
        asked = await record(log, 8)
        _, report = await experiment(log, "skips_notice", concurrency=4)
        expected = {(sid, i) for sid, texts in asked.items() for i, text in enumerate(texts) if text == TASK}
        found = {(s.origin_session_id, t.index) for s in report.sessions for t in s.divergent_turns}
        assert found == expected
        assert report.summary()["sessions_complete"] == 8
        with postgres_store(dsn) as store:
            await Projector(log, store).catch_up()
            assert {r["session_id"] for r in queries.list_sessions(store, limit=1000)} == set(asked)
            assert {r["session_id"] for r in store.costliest_sessions(1000)} == set(asked)
            replay = replay_id(report.experiment_id, next(iter(asked)))
            assert store.session(replay) is not None  # inspectable in the viewer


async def test_turn_workers_leave_experiment_sessions_to_their_runner(
    sqlite_log: SqliteEventLog,
) -> None:
    """A message waiting in a replay (its runner died before it ran the turn) is not run by a turn
    worker, which has the real tools; a production session's message is."""
    from turnlog.consumers import TurnWorker

    api = AgentSessions(sqlite_log, candidates.same(), producer="test")
    replay = await api.create_session("logistics-assistant", "u", session_id="exp-0123456789ab-00")
    production = await api.create_session("logistics-assistant", "u")
    for sid in (replay.session_id, production.session_id):
        await api.post_user_message(sid, LOOKUP)
    await TurnWorker(sqlite_log, candidates.same()).poll_once()
    waiting = await api.get_state(replay.session_id)
    assert len(waiting.inbox) == 1 and waiting.turns_finished == 0
    assert (await api.get_state(production.session_id)).turns_finished == 1
    assert candidates.BACKEND.outbox == []  # a lookup sends nothing either way


async def test_selection_by_user_agent_time_ids_and_a_seeded_sample(sqlite_log: SqliteEventLog) -> None:
    from turnlog.engine.errors import InputError
    from turnlog.engine.experiments import select_sessions

    asked = list(await record(sqlite_log, 8))
    heads = {sid: (await sqlite_log.read_session(sid))[0] for sid in asked}
    assert await select_sessions(sqlite_log, Selection()) == asked  # oldest first
    by_user = await select_sessions(sqlite_log, Selection(user_id="user-1"))
    assert by_user == [sid for sid in asked if heads[sid].user_id == "user-1"] and by_user
    assert await select_sessions(sqlite_log, Selection(agent_id="logistics-assistant")) == asked
    middle = heads[asked[4]].time_ms
    assert await select_sessions(sqlite_log, Selection(since_ms=middle)) == [
        sid for sid in asked if heads[sid].time_ms >= middle
    ]
    assert await select_sessions(sqlite_log, Selection(session_ids=(asked[2], asked[0]))) == [
        asked[0],
        asked[2],
    ]
    sample = await select_sessions(sqlite_log, Selection(sample=3, seed=7))
    assert len(sample) == 3 and set(sample) < set(asked)
    assert await select_sessions(sqlite_log, Selection(sample=3, seed=7)) == sample  # the seed decides
    with pytest.raises(InputError, match="no recorded session matches"):
        await select_sessions(sqlite_log, Selection(until_ms=heads[asked[0]].time_ms))
    _, report = await experiment(sqlite_log, "same", experiment_id="0123456789ab")
    replay = report.sessions[0].replay_session_id
    with pytest.raises(InputError, match="an experiment's own session"):
        await select_sessions(sqlite_log, Selection(session_ids=(replay,)))
    assert await select_sessions(sqlite_log, Selection()) == asked  # replays are never selected


async def test_a_replay_from_the_snapshot_at_the_end_of_the_first_turn(sqlite_log: SqliteEventLog) -> None:
    """from_turn=1: each replay is a fork of its origin at the snapshot taken when turn 1 ended,
    and only the later turns are replayed (and compared)."""
    asked = await record(sqlite_log, 4)
    _, report = await experiment(sqlite_log, "skips_notice", from_turn=1)
    assert {s.origin_session_id for s in report.divergent_sessions} == {
        sid for sid, texts in asked.items() if texts == [LOOKUP, TASK]
    }
    for s in report.sessions:
        texts = asked[s.origin_session_id]
        assert [t.user_text for t in s.turns] == texts[1:]
        events = await sqlite_log.read_session(s.replay_session_id)
        forked = events[0]
        assert isinstance(forked, ev.SessionForked) and forked.origin_session_id == s.origin_session_id
        origin = await sqlite_log.read_session(s.origin_session_id)
        first_end = next(e.version for e in origin if isinstance(e, ev.TurnFinished))
        assert forked.origin_version == first_end + 1  # the turn-end snapshot, in the same commit
        assert [e.text for e in events if isinstance(e, ev.UserMessageReceived)] == texts[1:]


async def test_a_from_turn_past_what_the_sessions_have_is_refused_with_the_range(
    sqlite_log: SqliteEventLog,
) -> None:
    from turnlog.engine.errors import InputError
    from turnlog.engine.experiments import list_experiments

    await record(sqlite_log, 4)  # the shortest sessions have one turn
    runner = ExperimentRunner(sqlite_log, candidates.same())
    for wrong in (2, 2**62, -1):
        with pytest.raises(
            InputError, match=rf"from_turn must be in 0\.\.1 .*not {wrong}: session \w+ has ended 1 turns"
        ):
            await runner.define(Selection(), candidate="tests.agentpkg.experiments:same", from_turn=wrong)
    assert await list_experiments(sqlite_log) == []  # nothing was written
    spec = await runner.define(Selection(), candidate="tests.agentpkg.experiments:same", from_turn=1)
    assert spec.from_turn == 1 and len(spec.sessions) == 4
