"""Batched projections (projections/batch.py, projections/rebuild.py), on both stores: a batch is
one transaction whatever its size and however it cuts sessions, replays change nothing, a crash
between batches continues exactly once, poison is handled as before, and the event loop runs on
while a batch waits for the database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from aiokafka import AIOKafkaProducer

from tests.services import need_service, postgres_store
from turnlog.consumers import Projector
from turnlog.consumers.analytics import AnalyticsConsumer
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    SessionStatus,
    ToolFailure,
    call,
    fold,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.errors import MalformedEventError
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.sqlite_batch import pack_batch
from turnlog.engine.models.base import ModelRequest
from turnlog.projections import PostgresProjectionStore, ProjectionStore, SqliteProjectionStore, rebuild
from turnlog.projections.rebuild import AppliedBatch, catch_up
from turnlog.projections.schema import READ_MODELS

SESSIONS = 12


@tool(idempotent=True)
async def lookup(order_id: str) -> dict:
    """Look up an order."""
    if order_id.endswith("3"):
        raise ToolFailure("order not found")
    return {"order_id": order_id, "status": "delayed"}


def _two_lookups(request: ModelRequest):
    """Per turn: two lookups, then an answer (the second call says which user message it serves)."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if len(results) < 2:
        order = f"O-{len(request.messages)}{len(results)}"
        return reply("checking", call("lookup", {"order_id": order}, f"c{len(request.messages)}"))
    return reply(f"answer: {results[-1].content}")


async def _concurrent_sessions(log: EventLog, sessions: int = SESSIONS, turns: int = 2) -> int:
    """``sessions`` sessions talking at once, so their events interleave in every partition;
    returns the number of events on the log."""
    api = AgentSessions(log, AgentDirectory([Agent.build("agent", FunctionModel(_two_lookups), [lookup])]))

    async def talk(s: int) -> int:
        sid = (await api.create_session("agent", f"user-{s % 3}")).session_id
        for t in range(turns):
            async for _ in api.send_user_message(sid, f"where is order {s}{t}?"):
                pass
        return await log.session_version(sid)

    return sum(await asyncio.gather(*(talk(s) for s in range(sessions))))


def tables(store: ProjectionStore) -> dict[str, list[dict]]:
    return {name: store.table(name) for name in READ_MODELS}


async def _all_records(log: EventLog) -> list[LogRecord]:
    return [r for p in range(log.partitions) for r in await log.read_partition(p, 0, 100_000)]


@pytest.fixture
def open_store(backend: str, tmp_path: Path) -> Iterator[Callable[[str], ProjectionStore]]:
    """Opens more stores of the test's backend by name (the same name: the same database)."""
    opened: list[ProjectionStore] = []
    schemas: set[str] = set()

    def opener(name: str) -> ProjectionStore:
        store: ProjectionStore
        if backend == "sqlite":
            store = SqliteProjectionStore(tmp_path / f"{name}.db")
        else:
            schema = f"test_{name}_{os.getpid()}_{id(opened)}"[:60]
            store = PostgresProjectionStore(need_service("TURNLOG_POSTGRES_DSN"), schema=schema)
            schemas.add(schema)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()
    for schema in schemas:
        with postgres_store(need_service("TURNLOG_POSTGRES_DSN"), schema=schema) as pg:
            pg.drop_schema()


async def test_one_batch_of_many_sessions_equals_applying_event_by_event(
    log: EventLog, store: ProjectionStore, open_store: Callable[[str], ProjectionStore]
) -> None:
    total = await _concurrent_sessions(log)
    batches: list[AppliedBatch] = []
    assert await catch_up(log, store, batch=100_000, on_batch=batches.append) == total
    assert [b.records for b in batches] == [total]  # every partition, one transaction
    assert len(store.table("sessions")) == SESSIONS

    one_by_one = open_store("one_by_one")
    assert await catch_up(log, one_by_one, batch=1) == total
    assert tables(store) == tables(one_by_one)
    for p in range(log.partitions):
        assert store.next_offset(p) == one_by_one.next_offset(p)
        assert await log.read_partition(p, store.next_offset(p)) == []


async def test_sessions_split_across_batches_end_as_in_one_batch(
    log: EventLog, store: ProjectionStore, open_store: Callable[[str], ProjectionStore]
) -> None:
    total = await _concurrent_sessions(log, sessions=6)
    batches: list[AppliedBatch] = []
    assert await catch_up(log, store, batch=7, on_batch=batches.append) == total
    assert len(batches) >= total // 7 and all(b.records <= 7 for b in batches)
    assert sum(b.applied for b in batches) == total
    whole = open_store("whole")
    await catch_up(log, whole, batch=100_000)
    assert tables(store) == tables(whole)
    for row in store.table("sessions"):
        assert row["state_version"] == await log.session_version(row["session_id"])
        messages = store.rows_of("messages", row["session_id"])
        assert [m["seq"] for m in messages] == list(range(1, row["message_count"] + 1))


def _session_events(sid: str) -> list[ev.Event]:
    """One session that touches every kind of row update: a model call abandoned by the next
    one, an approval, a superseded result, archived messages, a guard stop, a direct call."""
    t, v = "turn-1", iter(range(1, 100))
    calls = (ev.ToolCallSpec(call_id="c1", name="refund", arguments_json="{}"),)
    return [
        ev.SessionCreated(session_id=sid, version=next(v), agent_id="a", user_id="u"),
        ev.UserMessageReceived(session_id=sid, version=next(v), message_id="m1", text="refund A-1"),
        ev.TurnStarted(session_id=sid, version=next(v), turn_id=t, message_id="m1"),
        ev.StateChanged(session_id=sid, version=next(v), from_state="IDLE", to_state="PROCESSING",
                        cause="user_message"),
        ev.ModelCallStarted(session_id=sid, version=next(v), turn_id=t, step=0, model="m", message_count=1,
                            tools_offered=1),
        ev.ModelCallStarted(session_id=sid, version=next(v), turn_id=t, step=1, model="m", message_count=1,
                            tools_offered=1),  # step 0 was cut off: abandoned
        ev.ModelCallFinished(session_id=sid, version=next(v), turn_id=t, step=1, model="m", status="ok",
                             input_tokens=10, output_tokens=5, cost_micros=7),
        ev.AssistantMessage(session_id=sid, version=next(v), turn_id=t, message_id="a1", text="",
                            tool_calls=calls),
        ev.ToolCallRequested(session_id=sid, version=next(v), turn_id=t, call_id="c1", tool_name="refund",
                             arguments_json="{}", iteration=1),
        ev.ApprovalRequested(session_id=sid, version=next(v), turn_id=t, call_id="c1", tool_name="refund",
                             arguments_json="{}", sensitivity="high"),
        ev.ApprovalDecided(session_id=sid, version=next(v), turn_id=t, call_id="c1", decision="approved",
                           arguments_json="{}"),
        ev.ToolCallStarted(session_id=sid, version=next(v), turn_id=t, call_id="c1", tool_name="refund"),
        ev.ToolCallFinished(session_id=sid, version=next(v), turn_id=t, call_id="c1", tool_name="refund",
                            status="success", content="refunded"),
        ev.ToolResultSuperseded(session_id=sid, version=next(v), turn_id=t, call_id="c1", superseded_by="c2"),
        ev.ContextTrimmed(session_id=sid, version=next(v), turn_id=t, step=2,
                          items_json=json.dumps([{"ref": 2, "action": "cut", "reason": "small talk"}]),
                          history_tokens_before=90, history_tokens_after=40, history_budget=64),
        ev.HistorySummarized(session_id=sid, version=next(v), turn_id=t, step=2, removed_refs_json="[8, 13]",
                             summary="refund done", summarizer="extractive", reason="tokens"),
        ev.LoopGuardTriggered(session_id=sid, version=next(v), turn_id=t, guard="max_iterations", reason="8"),
        ev.StateChanged(session_id=sid, version=next(v), from_state="PROCESSING", to_state="FINISHED",
                        cause="guard"),
        ev.TurnFinished(session_id=sid, version=next(v), turn_id=t, message_id="m1", reason="guard",
                        iterations=1, model_calls=2, input_tokens=10, output_tokens=5),
        ev.ToolInvoked(session_id=sid, version=next(v), call_id="d1", tool_name="lookup", arguments_json="{}",
                       actor="admin", status="success", content="ok"),
        ev.SessionClosed(session_id=sid, version=next(v), reason="done"),
    ]  # fmt: skip


def _interleaved(*sessions: list[ev.Event]) -> list[ev.Event]:
    out: list[ev.Event] = []
    for i in range(max(len(s) for s in sessions)):
        out += [s[i] for s in sessions if i < len(s)]
    return out


async def test_every_cut_of_a_batch_gives_the_same_rows(store: ProjectionStore) -> None:
    """Updates are folded into rows inserted by the same batch, and sent as SQL for rows from
    earlier batches: wherever a batch boundary falls, the rows are the same."""
    events = _interleaved(_session_events("s-1"), _session_events("s-2"))
    assert store.apply_events(events) == len(events)
    whole = tables(store)
    calls = {(r["step"], r["status"]) for r in whole["model_calls"] if r["session_id"] == "s-1"}
    assert calls == {(0, "abandoned"), (1, "ok")}
    archived = [(m["seq"], m["archived_by"]) for m in whole["messages"] if m["session_id"] == "s-1"]
    assert archived == [(1, 15), (2, 16), (3, 16)]
    (refund,) = [c for c in whole["tool_calls"] if c["session_id"] == "s-1" and c["call_id"] == "c1"]
    assert (refund["status"], refund["approval"], refund["superseded_by"]) == ("success", "approved", "c2")
    for cut in range(1, len(events)):
        store.reset()
        assert store.apply_events(events[:cut]) + store.apply_events(events[cut:]) == len(events)
        assert tables(store) == whole, f"cut after event {cut}"


async def test_a_replayed_batch_changes_nothing(log: EventLog, store: ProjectionStore) -> None:
    total = await _concurrent_sessions(log, sessions=4)
    assert await catch_up(log, store) == total
    before = tables(store)
    offsets = {p: store.next_offset(p) for p in range(log.partitions)}
    records = await _all_records(log)
    assert store.apply(records) == 0
    assert await store.apply_async(records[len(records) // 3 : len(records) // 2]) == 0
    assert store.apply(records[:5]) == 0  # an old batch does not move the offsets back
    assert tables(store) == before
    assert {p: store.next_offset(p) for p in range(log.partitions)} == offsets


class Crash(Exception):
    """The process dies right after a batch committed."""


async def test_a_crash_between_batches_continues_exactly_once(
    log: EventLog, store: ProjectionStore, open_store: Callable[[str], ProjectionStore], backend: str
) -> None:
    total = await _concurrent_sessions(log, sessions=6)
    committed: list[AppliedBatch] = []

    def crash_after_three(batch: AppliedBatch) -> None:
        committed.append(batch)
        if len(committed) == 3:
            raise Crash

    with pytest.raises(Crash):
        await catch_up(log, store, batch=25, on_batch=crash_after_three)
    reopened = _reopen(store, backend)  # a new process starts from the stored offsets
    try:
        at_crash = sum(r["state_version"] for r in reopened.table("sessions"))  # versions start at 1
        assert sum(b.applied for b in committed) <= at_crash < total  # the batch read ahead may be in
        assert await catch_up(log, reopened, batch=25) == total - at_crash
        live = tables(reopened)
    finally:
        reopened.close()
    rebuilt = open_store("rebuilt")
    assert await rebuild(log, rebuilt) == total
    assert tables(rebuilt) == live


def _reopen(store: ProjectionStore, backend: str) -> ProjectionStore:
    """Another process's store on the same database, starting from the stored offsets."""
    if backend == "sqlite":
        assert isinstance(store, SqliteProjectionStore)
        return SqliteProjectionStore(store.path)
    assert isinstance(store, PostgresProjectionStore)
    return PostgresProjectionStore(need_service("TURNLOG_POSTGRES_DSN"), schema=store.schema)


async def _poison(log: EventLog, log_path: Path, sid: str) -> None:
    """A foreign writer puts bytes that are not a turnlog event into ``sid``'s partition."""
    partition = log.partition_of(sid)
    if isinstance(log, KafkaEventLog):
        raw = AIOKafkaProducer(bootstrap_servers=log.bootstrap)
        await raw.start()
        try:
            await raw.send_and_wait(log.topics.events, b"\x00junk", key=sid.encode(), partition=partition)
        finally:
            await raw.stop()
        return
    with contextlib.closing(sqlite3.connect(log_path)) as db, db:
        db.execute(
            "INSERT INTO batches (position, partition, session, version, count, value) "
            "SELECT (SELECT MAX(position + count) FROM batches), ?, key, 999, 1, ? FROM sessions "
            "WHERE session_id = ?",
            (partition, pack_batch([b"\x00junk"], compress=False), sid),
        )


async def test_an_undecodable_record_is_handled_as_before(
    log: EventLog, store: ProjectionStore, backend: str, log_path: Path
) -> None:
    """SQLite: the pass stops at the record with an error naming it, keeps what it applied before
    and changes nothing when run again. Kafka: the owner dead-letters it and moves the session to
    ERROR, which the projection shows; the projector goes on."""
    await _concurrent_sessions(log, sessions=6)
    victim = (await _all_records(log))[-1].event.session_id  # in the last partition with records
    partition = log.partition_of(victim)
    await _poison(log, log_path, victim)
    if backend == "kafka":
        await _until_error(log, victim)
        projector = Projector(log, store)
        await projector.catch_up()
        row = store.session(victim)
        assert row is not None and row["current_state"] == "ERROR"
        assert all(lag.records == 0 for lag in (await projector.lag()).values())
        return
    with pytest.raises(MalformedEventError, match=rf"partition {partition} offset \d+"):
        await catch_up(log, store)
    applied = tables(store)
    assert {r["session_id"] for r in applied["sessions"]} == {
        r.event.session_id for p in range(partition) for r in await log.read_partition(p, 0, 100_000)
    }
    offsets = {p: store.next_offset(p) for p in range(log.partitions)}
    with pytest.raises(MalformedEventError):
        await catch_up(log, store)
    assert tables(store) == applied
    assert {p: store.next_offset(p) for p in range(log.partitions)} == offsets


async def _until_error(log: EventLog, sid: str) -> None:
    for _ in range(600):
        if fold(sid, await log.read_session(sid)).status == SessionStatus.ERROR:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"the owner never moved {sid} to ERROR after its poison record")


@contextlib.contextmanager
def _offsets_locked(store: ProjectionStore) -> Iterator[Callable[[], bool]]:
    """Another connection holds a lock that keeps a batch from committing its offsets (reads of
    the read models go on). Yields a check: is a writer waiting for the lock? A timer thread lets
    go after LOCK_HELD_S, so an implementation that blocks the loop fails the test, not hangs it."""
    if isinstance(store, SqliteProjectionStore):
        db = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
        db.execute("BEGIN IMMEDIATE")  # SQLite's write lock: the batch's BEGIN IMMEDIATE waits
        with _released_at_the_latest(lambda: db.execute("ROLLBACK")):
            yield lambda: True  # SQLite shows no lock waits; the test's task state tells
        db.close()
        return
    assert isinstance(store, PostgresProjectionStore)
    with psycopg.connect(need_service("TURNLOG_POSTGRES_DSN")) as conn:
        conn.execute(f"LOCK TABLE {store.schema}.projection_offsets IN SHARE MODE")
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE NOT granted "
            f"AND relation = '{store.schema}.projection_offsets'::regclass"
        )
        with (
            psycopg.connect(need_service("TURNLOG_POSTGRES_DSN"), autocommit=True) as probe,
            _released_at_the_latest(conn.rollback),
        ):
            yield lambda: bool(probe.execute(waiting).fetchone()[0])  # type: ignore[index]


LOCK_HELD_S = 30.0


@contextlib.contextmanager
def _released_at_the_latest(release: Callable[[], object]) -> Iterator[None]:
    """Run ``release`` once: when the block ends, or after LOCK_HELD_S from a timer thread."""
    once = threading.Lock()

    def release_once() -> None:
        if once.acquire(blocking=False):
            release()

    timer = threading.Timer(LOCK_HELD_S, release_once)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        release_once()


async def _until(check: Callable[[], bool], what: str, bound_s: float = 60.0) -> None:
    """Poll ``check`` on the loop until it holds."""
    try:
        async with asyncio.timeout(bound_s):
            while not check():
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"waited {bound_s} s for {what}")


async def test_the_event_loop_runs_while_a_batch_waits_for_the_database(
    log: EventLog, store: ProjectionStore
) -> None:
    total = await _concurrent_sessions(log, sessions=4)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    running = asyncio.create_task(ticker())
    try:
        with _offsets_locked(store) as writer_waits:
            applying = asyncio.create_task(catch_up(log, store))
            await _until(writer_waits, "the batch waiting for the lock")
            seen = ticks
            await _until(lambda: ticks >= seen + 20, "20 more ticks of another coroutine")
            assert not applying.done(), "the batch went through a lock another connection holds"
            assert store.table("sessions") == []  # reads run meanwhile, and see committed rows only
        assert await asyncio.wait_for(applying, 60) == total
    finally:
        running.cancel()
    assert len(store.table("sessions")) == 4


async def test_a_batch_cut_off_mid_transaction_leaves_nothing(
    log: EventLog, store: ProjectionStore, backend: str
) -> None:
    """PostgreSQL ends the batch's connection while the batch waits for a lock: nothing of it
    stays, and the next pass applies it all."""
    if backend != "kafka":
        pytest.skip("PostgreSQL: SQLite has no way to end another connection's transaction")
    total = await _concurrent_sessions(log, sessions=4)
    assert isinstance(store, PostgresProjectionStore)
    with _offsets_locked(store) as writer_waits:
        applying = asyncio.create_task(catch_up(log, store))
        await _until(writer_waits, "the batch waiting for the lock")
        with psycopg.connect(need_service("TURNLOG_POSTGRES_DSN"), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE NOT granted "
                f"AND relation = '{store.schema}.projection_offsets'::regclass"
            )
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(applying, 60)
    assert store.table("sessions") == [] and store.next_offset(0) == 0
    assert await catch_up(log, store) == total
    assert len(store.table("sessions")) == 4


async def test_the_projector_reports_its_lag_per_partition(log: EventLog, store: ProjectionStore) -> None:
    await _concurrent_sessions(log, sessions=3, turns=1)
    projector = Projector(log, store)
    ends = {p: await log.end_offset(p) for p in range(log.partitions)}
    before = await projector.lag()
    assert {p: (lag.end_offset, lag.applied_offset, lag.records) for p, lag in before.items()} == {
        p: (end, 0, end) for p, end in ends.items()
    }
    first = [(await log.read_partition(p, 0, 1) or [None])[0] for p in range(log.partitions)]
    assert [lag.oldest_pending_ms for lag in before.values()] == [r and r.event.time_ms for r in first]
    assert all(lag.behind_ms() > 0 for lag in before.values() if lag.records)
    assert projector.last_batch is None
    await projector.catch_up()
    assert all(lag.records == 0 and lag.behind_ms() == 0 for lag in (await projector.lag()).values())
    last = projector.last_batch
    assert last is not None and 0 < last.oldest_event_ms <= last.committed_ms

    applied = {p: lag.applied_offset for p, lag in (await projector.lag()).items()}
    await _concurrent_sessions(log, sessions=1, turns=1)
    behind = {p: lag.records for p, lag in (await projector.lag()).items() if lag.records}
    assert len(behind) == 1  # the new session's partition
    assert behind == {p: await log.end_offset(p) - applied[p] for p in behind}
    await projector.catch_up()
    assert all(lag.records == 0 for lag in (await projector.lag()).values())


async def test_concurrent_passes_apply_each_event_once(log: EventLog, store: ProjectionStore) -> None:
    """The gateway's follower and its routes call catch_up at the same time."""
    total = await _concurrent_sessions(log, sessions=4)
    projector = Projector(log, store, batch=10)
    assert sum(await asyncio.gather(*(projector.catch_up() for _ in range(4)))) == total
    analytics = AnalyticsConsumer(log, store, batch=10)
    assert sum(await asyncio.gather(*(analytics.catch_up() for _ in range(4)))) == total
    (day,) = analytics.report(days=2)["days"]
    assert day["sessions"] == 4 and day["turns"] == 8
