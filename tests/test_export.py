"""`turnlog export`: the log as Parquet datasets, incremental and exactly once, on both backends;
a SIGKILLed `--follow` export resumes with no duplicate or missing row."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.export_support import (
    agents,
    every_record,
    exported_keys,
    read_dataset,
    record_run,
    turnlog_cli,
)
from tests.services import kafka_log, need_service
from turnlog.consumers.export import Exporter
from turnlog.consumers.export_files import STATE_FILE, load_state
from turnlog.consumers.projector import Projector
from turnlog.engine import AgentSessions
from turnlog.engine import events as ev
from turnlog.engine.errors import ExportError
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.projections.export_rows import DATASETS, rows_of
from turnlog.projections.store import ProjectionStore

# -- rows: a pure function of each event, no I/O ------------------------------------------------


def test_rows_of_each_event_are_its_facts_with_content_only_when_asked() -> None:
    finished = ev.ToolCallFinished(
        session_id="s", version=9, time_ms=86_400_000 * 3 + 5, turn_id="t", call_id="c", tool_name="ping",
        status="rejected", content="[REJECTED] ping was not run", elapsed_ms=0.0, attempts=0,
        error="loop guard: repeated_call",
    )  # fmt: skip
    head = ("s", 9, 86_400_000 * 3 + 5, 2, 40)
    assert rows_of(finished, 2, 40, False) == [
        ("tool_calls", (*head, "t", "c", "ping", "rejected", 0.0, 0, "loop guard: repeated_call",
                        "repeated_call", None)),
        ("messages", (*head, finished.event_id, "tool", "t", 27, 0, "c", "ping")),
    ]  # fmt: skip
    with_content = rows_of(finished, 2, 40, True)
    assert [row[-1] for _, row in with_content] == [finished.content, finished.content]
    for name, row in with_content:  # every row fits its dataset's columns, in both modes
        assert len(row) == len(DATASETS[name].columns_for(True))
    for name, row in rows_of(finished, 2, 40, False):
        assert len(row) == len(DATASETS[name].columns_for(False))

    turn = ev.TurnFinished(
        session_id="s", version=10, turn_id="t", message_id="m", reason="unchanged_result",
        iterations=3, model_calls=4, input_tokens=100, output_tokens=7, cost_micros=55,
    )  # fmt: skip
    ((name, row),) = rows_of(turn, 0, 1, False)
    assert name == "turns" and row[5:] == ("t", "m", "unchanged_result", "unchanged_result", 3, 4, 100, 7, 55)
    answered = ev.TurnFinished(
        session_id="s", version=11, turn_id="t", message_id="m", reason="answered",
        iterations=0, model_calls=1, input_tokens=1, output_tokens=1,
    )  # fmt: skip
    assert rows_of(answered, 0, 1, False)[0][1][8] is None  # no guard

    failed = ev.ModelCallFinished(
        session_id="s", version=5, turn_id="", step=0, model="m", status="failed", retries=1, error="boom"
    )
    ((name, row),) = rows_of(failed, 0, 1, False)
    assert name == "model_calls" and row[5:9] == (None, 0, "turn", "m") and row[15:17] == (1, True)
    aux = ev.AuxiliaryModelCall(
        session_id="s", version=7, turn_id="t", purpose="summary", model="m", status="ok"
    )
    assert rows_of(aux, 0, 1, False)[0][1][6:8] == (-7, "summary")
    snapshot = ev.SnapshotTaken(
        session_id="s", version=8, state_format=0, status="IDLE", last_tool="", turns=0, input_tokens=0,
        output_tokens=0, message_count=0, keyframe_version=0, state_json="",
    )  # fmt: skip
    assert rows_of(snapshot, 0, 1, True) == ()
    created = ev.SessionCreated(session_id="exp-x-1", version=1, agent_id="a", user_id="u")
    assert rows_of(created, 0, 1, False)[0][1][5:] == ("a", "u", "user", "", None, None, True)


# -- the export against the log and the read models, on both backends ---------------------------


def expected_keys(records: list[LogRecord]) -> dict[str, list[tuple[str, int]]]:
    """(session_id, version) of every row the records make, per dataset: one row per fact."""
    keys: dict[str, list[tuple[str, int]]] = {name: [] for name in DATASETS}
    for r in records:
        for name, row in rows_of(r.event, r.partition, r.offset, False):
            keys[name].append((row[0], row[1]))
    return {name: sorted(found) for name, found in keys.items()}


def source_of(log: EventLog) -> str:
    return f"kafka:{log.topics.events}" if isinstance(log, KafkaEventLog) else f"sqlite:{log.path}"  # type: ignore[attr-defined]


async def export_all(log: EventLog, out: Path, *, batch: int = 7, content: bool = False) -> Exporter:
    exporter = Exporter(log, out, source=source_of(log), content=content, batch=batch)
    exporter.open()
    try:
        await exporter.export()
    finally:
        exporter.close()
    return exporter


async def test_export_holds_every_fact_once_and_matches_the_projections(
    log: EventLog, store: ProjectionStore, tmp_path: Path
) -> None:
    sessions = await record_run(log)
    out = tmp_path / "export"
    out.mkdir()
    first = await export_all(log, out)
    records = await every_record(log)
    assert first.done >= len(records) and first.files > 6  # small batches: many flushes
    assert exported_keys(out) == expected_keys(records)

    await Projector(log, store).catch_up()
    by_session = {r["session_id"]: r for r in read_dataset(out, "sessions")}
    assert set(by_session) == set(sessions)
    for sid in sessions:
        row = store.session(sid)
        assert row is not None
        assert (by_session[sid]["user_id"], by_session[sid]["agent_id"]) == (row["user_id"], row["agent_id"])
        calls = [c for c in read_dataset(out, "model_calls") if c["session_id"] == sid]
        assert sum(c["cost_micros"] for c in calls) == row["cost_micros"]
        turns = [t for t in read_dataset(out, "turns") if t["session_id"] == sid]
        assert len(turns) == row["turns"]
        messages = [m for m in read_dataset(out, "messages") if m["session_id"] == sid]
        assert len(messages) == row["message_count"]
    tool_rows = {(t["session_id"], t["call_id"]): t for t in read_dataset(out, "tool_calls")}
    for sid in sessions:
        for call in store.rows_of("tool_calls", sid):
            exported = tool_rows[(sid, call["call_id"])]
            assert (exported["status"], exported["attempts"]) == (call["status"], call["attempts"])
    # the guard that refused a call is named on it (engine.tools.batch's error text)
    assert [t["guard"] for t in tool_rows.values() if t["guard"]] == ["repeated_call"]
    assert "content" not in read_dataset(out, "messages")[0]  # no content unless asked

    # incremental: nothing new, nothing written; new events, only their rows
    again = await export_all(log, out)
    assert (again.done, again.files) == (0, 0)
    api = AgentSessions(log, agents())
    sid = (await api.create_session("ops", "u9")).session_id
    async for _ in api.send_user_message(sid, "are the hosts up?"):
        pass
    await export_all(log, out)
    assert exported_keys(out) == expected_keys(await every_record(log))


async def test_content_columns_only_with_content_and_never_mixed(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    try:
        await record_run(log)
        out = tmp_path / "with-content"
        out.mkdir()
        await export_all(log, out, content=True)
        texts = {m["content"] for m in read_dataset(out, "messages")}
        assert "where is my order?" in texts and "All hosts answer." in texts
        results = {t["result"] for t in read_dataset(out, "tool_calls")}
        assert "order A1: in transit" in results
        with pytest.raises(ExportError, match="with --content; run it with --content"):
            await export_all(log, out, content=False)
    finally:
        await log.close()


async def test_files_a_killed_flush_left_are_replaced_not_duplicated(tmp_path: Path) -> None:
    """A crash after a flush's files were written but before its position was committed: the
    state file still names the earlier position (restored here from a copy taken then)."""
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    try:
        api = AgentSessions(log, agents())
        sid = (await api.create_session("support", "u1")).session_id
        async for _ in api.send_user_message(sid, "where is my order?"):
            pass
        out = tmp_path / "export"
        out.mkdir()
        await export_all(log, out, batch=1000)
        committed_then = (out / STATE_FILE).read_text()
        async for _ in api.send_user_message(sid, "and now?"):
            pass
        await export_all(log, out, batch=3)
        assert exported_keys(out) == expected_keys(await every_record(log))
        (out / STATE_FILE).write_text(committed_then)  # the later run's files are now uncommitted
        (out / "turns" / "day=2026-01-01").mkdir(parents=True)
        (out / "turns" / "day=2026-01-01" / "p0-000000000000-000000000009.parquet.tmp").write_bytes(b"half")
        resumed = await export_all(log, out, batch=5)  # cut differently from the killed run
        assert resumed.done > 0
        assert exported_keys(out) == expected_keys(await every_record(log))
        assert not list(out.glob("*/*/*.tmp"))
    finally:
        await log.close()


async def test_a_directory_that_cannot_take_an_export_is_refused_with_what_to_do(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    try:
        with pytest.raises(ExportError, match=r"does not exist; create it first \(mkdir -p"):
            await export_all(log, tmp_path / "missing")
        (tmp_path / "file").write_text("x")
        with pytest.raises(ExportError, match="is not a directory"):
            await export_all(log, tmp_path / "file")
        out = tmp_path / "out"
        out.mkdir()
        holder = Exporter(log, out, source=source_of(log))
        holder.open()
        try:
            with pytest.raises(ExportError, match="another turnlog export is writing to"):
                await export_all(log, out)
        finally:
            holder.close()
        await export_all(log, out)
        other = SqliteEventLog(tmp_path / "other.db", partitions=2)
        try:
            with pytest.raises(ExportError, match="export this log into another directory"):
                await export_all(other, out)
        finally:
            await other.close()
        (out / STATE_FILE).write_text("{not json")
        with pytest.raises(ExportError, match="committed position: restore it"):
            await export_all(log, out)
    finally:
        await log.close()


def test_the_command_says_what_is_wrong_with_its_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = turnlog_cli("export", str(tmp_path / "out"), "--home", str(home))
    err = " ".join(proc.communicate(timeout=120)[0].split())
    assert proc.returncode == 2 and "there is no log at" in err
    asyncio.run(_make_log(home / "log.db"))
    proc = turnlog_cli("export", str(tmp_path / "nowhere"), "--home", str(home))
    err = " ".join(proc.communicate(timeout=120)[0].split())
    assert proc.returncode == 2 and "does not exist; create it first" in err
    unwritable = Path("/proc/self/fdinfo")  # a directory no one, root included, can add files to
    proc = turnlog_cli("export", str(unwritable), "--home", str(home))
    flat = " ".join(proc.communicate(timeout=120)[0].split())
    assert proc.returncode == 2 and ("cannot write in the output directory" in flat or "not writable" in flat)


async def _make_log(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    log = SqliteEventLog(path, partitions=8)
    await record_run(log)
    await log.close()


# -- a SIGKILLed --follow export resumes with no duplicate or missing row ------------------------


async def _state_offsets(out: Path) -> int:
    state = await asyncio.to_thread(load_state, out)
    return sum(state.next_offsets.values()) if state else 0


@contextlib.asynccontextmanager
async def log_in_home(backend: str, home: Path) -> AsyncIterator[tuple[EventLog, list[str]]]:
    """A log the command can name: HOME/log.db, or a fresh Kafka topic; with the options saying so."""
    if backend == "sqlite":
        home.mkdir()
        sqlite = SqliteEventLog(home / "log.db", partitions=4)
        try:
            yield sqlite, ["--home", str(home)]
        finally:
            await sqlite.close()
        return
    async with kafka_log(need_service("TURNLOG_KAFKA_BOOTSTRAP"), partitions=4) as kafka:
        yield kafka, ["--kafka", kafka.bootstrap, "--topic", kafka.topics.events]


async def test_sigkilled_follow_export_resumes_without_duplicate_or_missing_row(
    backend: str, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    out.mkdir()
    async with log_in_home(backend, tmp_path / "home") as (log, where):
        await record_run(log)
        args = [
            "export",
            str(out),
            *where,
            "--partitions",
            "4",
            "--follow",
            "--batch",
            "5",
            "--interval",
            "0.05",
        ]
        writing = asyncio.create_task(_keep_writing(log))
        try:
            for _ in range(3):  # killed three times, each once it has committed more
                committed = await _state_offsets(out)
                follower = turnlog_cli(*args)
                await _until(lambda: _state_offsets(out), lambda n, c=committed: n >= c + 40, follower)
                follower.send_signal(signal.SIGKILL)
                await asyncio.to_thread(follower.communicate, None, 60)
                assert follower.returncode == -signal.SIGKILL
        finally:
            writing.cancel()
            await asyncio.gather(writing, return_exceptions=True)
        await record_run(log)  # more after the kill
        resumed = turnlog_cli(*args[:-5])  # the same export, once, without --follow
        out_text, err = await asyncio.to_thread(resumed.communicate, None, 300)
        assert resumed.returncode == 0, err
        assert "exported" in out_text
        records = await every_record(log)
        assert exported_keys(out) == expected_keys(records)
        state = load_state(out)
        assert state is not None and state.next_offsets == _ends(records)


def _ends(records: list[LogRecord]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for r in records:
        ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
    return ends


async def _keep_writing(log: EventLog) -> None:
    api = AgentSessions(log, agents())
    n = 0
    while True:
        n += 1
        sid = (await api.create_session("ops", f"w{n}")).session_id
        async for _ in api.send_user_message(sid, "are the hosts up?"):
            pass
        await asyncio.sleep(0)


async def _until(read: Any, done: Any, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done(await read()):
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the export stopped early ({proc.returncode}): {err}")
        if loop.time() > deadline:
            proc.kill()
            raise AssertionError("the following export committed nothing in time")
        await asyncio.sleep(0.05)


def test_state_file_is_plain_json(tmp_path: Path) -> None:
    log_path = tmp_path / "home" / "log.db"
    asyncio.run(_make_log(log_path))
    out = tmp_path / "out"
    out.mkdir()
    proc = turnlog_cli("export", str(out), "--home", str(log_path.parent))
    text, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    state = json.loads((out / STATE_FILE).read_text())
    assert state["format"] == 1 and state["content"] is False
    assert state["source"] == f"sqlite:{log_path.resolve()}"
    assert sum(state["next_offsets"].values()) > 0
    assert os.path.exists(out / "turns")


def test_the_export_extra_is_pyarrow_and_says_how_to_install_it() -> None:
    from turnlog.engine import extras

    assert extras.requirements_of("export") == ("pyarrow",)
    assert extras.present("export")  # the test extra includes it
    assert "turnlog export" in extras.PURPOSES["export"]
    assert extras.install_command("export").endswith("[export]'")
