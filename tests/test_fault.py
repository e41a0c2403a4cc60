"""The distributed backend under faults: three turn-worker processes in the Kafka owners' group,
80 sessions of multi-step tool turns, workers SIGKILLed at random moments and restarted (eight
times), a producer that resubmits some messages as a retry after a lost acknowledgement does,
and (when this run started the broker with scripts/kafka.sh) a broker restart mid-run.

Afterwards, for every session: each accepted message entered the history once and in order and
had exactly one turn, answered; each tool call finished once; no non-idempotent tool ran twice
(it counts its side effects in PostgreSQL), and each keyed one ran again after a kill and took
effect exactly once (its service deduplicates by the key); every tool run got its call's logged
key; and the projections kept live by a projector equal a rebuild from offset 0.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.fleet import AGENT, SIDE_EFFECTS_DDL, deliveries, side_effects
from tests.services import delete_topics, fresh_topic, kafka_log, need_service, postgres_store
from turnlog.consumers import Projector
from turnlog.engine import SessionStatus, fold
from turnlog.engine import events as ev
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.projections import PostgresProjectionStore, rebuild
from turnlog.projections.schema import READ_MODELS

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 6
SESSIONS = 80
WORKERS = 3
KILLS = 8
RESUBMIT_EVERY = 4
"""Every 4th session's messages are submitted twice (the same event: a producer's retry)."""


class Fleet:
    """Worker processes that can be killed and restarted."""

    def __init__(self, bootstrap: str, topic: str, dsn: str, schema: str) -> None:
        self.args = [bootstrap, topic, str(PARTITIONS), dsn, schema]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.generation = 0
        self.logs: list[Path] = []

    def start(self, slot: int) -> None:
        self.generation += 1
        worker_id = f"w{slot}-g{self.generation}"
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"turnlog-fault-{os.getpid()}-{worker_id}.log"
        self.logs.append(out)
        with out.open("wb") as sink:
            self.procs[str(slot)] = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "procs.py"), "kafka-worker", *self.args, worker_id],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                cwd=REPO,
            )

    def kill(self, slot: int) -> None:
        proc = self.procs[str(slot)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        for path in self.logs:
            path.unlink(missing_ok=True)


def broker_script_started(bootstrap: str) -> bool:
    """True if scripts/kafka.sh runs the broker at ``bootstrap`` (so the test may restart it)."""
    port = os.environ.get("TURNLOG_KAFKA_PORT", "9092")
    if bootstrap != f"127.0.0.1:{port}":
        return False
    return subprocess.run([str(REPO / "scripts" / "kafka.sh"), "status"], capture_output=True).returncode == 0


async def restart_broker() -> None:
    for action in ("stop", "start"):
        proc = await asyncio.create_subprocess_exec(
            str(REPO / "scripts" / "kafka.sh"),
            action,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 300)
        assert proc.returncode == 0, out.decode()


async def submit_retrying(log: KafkaEventLog, event: ev.Event) -> None:
    """A producer retries while the broker is away; the event is accepted once, by its id."""
    for _ in range(120):
        try:
            await log.submit(event)
            return
        except Exception:  # LogUnavailableError while the broker restarts
            await asyncio.sleep(0.5)
    raise AssertionError(f"could not submit {event.type} for {event.session_id}")


async def all_answered(reader: KafkaEventLog, expected: dict[str, list[str]]) -> tuple[bool, str]:
    for sid, texts in expected.items():
        state = fold(sid, await reader.read_session(sid))
        answered = [
            m.content for m in state.messages if m.role == "assistant" and m.content.startswith("done")
        ]
        if state.status != SessionStatus.FINISHED or state.inbox or state.turn or len(answered) < len(texts):
            return False, f"{sid}: {state.status}, inbox {len(state.inbox)}, answered {answered}"
    return True, ""


async def test_killed_workers_and_a_restarted_broker_lose_nothing_and_repeat_no_side_effect() -> None:
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    dsn = need_service("TURNLOG_POSTGRES_DSN")
    rng = random.Random(int(os.environ.get("TURNLOG_FAULT_SEED", "7")))
    topic = fresh_topic()
    try:
        await _faults_on(topic, bootstrap, dsn, rng)
    finally:
        await delete_topics(bootstrap, topic)


async def _faults_on(topic: str, bootstrap: str, dsn: str, rng: random.Random) -> None:
    with postgres_store(dsn) as live, postgres_store(dsn) as rebuilt:
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={live.schema}") as conn:
            conn.execute(SIDE_EFFECTS_DDL)
        async with kafka_log(bootstrap, partitions=PARTITIONS, topic=topic, owner=False) as producer:
            fleet = Fleet(bootstrap, topic, dsn, live.schema)
            projector = Projector(producer, live, idle_wait_s=0.2)
            projecting = asyncio.create_task(projector.run())
            try:
                expected = await run_the_faults(producer, fleet, rng, bootstrap)
                for _ in range(360):  # at most ~3 min after the faults; normally done within a minute
                    done, why = await all_answered(producer, expected)
                    if done:
                        break
                    await asyncio.sleep(0.5)
                else:
                    pytest.fail(f"not every message was answered: {why}")
            finally:
                fleet.stop_all()
                projector.stop()
                await projecting
            await check_outcome(producer, expected, live, rebuilt, dsn)


async def run_the_faults(
    producer: KafkaEventLog, fleet: Fleet, rng: random.Random, bootstrap: str
) -> dict[str, list[str]]:
    """Start the fleet, submit the sessions, kill and restart workers (and the broker once);
    return each session's accepted messages."""
    expected: dict[str, list[str]] = {}
    for slot in range(WORKERS):
        fleet.start(slot)
    for i in range(SESSIONS):
        sid = f"fault-{i:03d}-{rng.randrange(10**6)}"
        expected[sid] = ["m1"]
        await submit_retrying(
            producer, ev.SessionCreated(session_id=sid, version=1, agent_id=AGENT, user_id="u")
        )
        await submit_message(producer, sid, "m1", twice=i % RESUBMIT_EVERY == 0)
    restart = broker_script_started(bootstrap) and os.environ.get("TURNLOG_FAULT_BROKER_RESTART", "1") == "1"
    for round_ in range(KILLS):
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        slot = rng.randrange(WORKERS)
        fleet.kill(slot)
        if round_ == 2:  # a second message for every session while workers die
            for i, (sid, texts) in enumerate(expected.items()):
                texts.append("m2")
                await submit_message(producer, sid, "m2", twice=i % RESUBMIT_EVERY == 1)
        if round_ == 4 and restart:
            await restart_broker()
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        fleet.start(slot)
    return expected


async def submit_message(producer: KafkaEventLog, sid: str, text: str, *, twice: bool) -> None:
    event = message(sid, text)
    await submit_retrying(producer, event)
    if twice:  # as a producer does that never saw the first acknowledgement
        await submit_retrying(producer, event)


def message(sid: str, text: str) -> ev.UserMessageReceived:
    return ev.UserMessageReceived(
        session_id=sid, version=0, message_id=f"{sid}-{text}", text=text, user_id="u"
    )


async def check_outcome(
    producer: KafkaEventLog,
    expected: dict[str, list[str]],
    live: PostgresProjectionStore,
    rebuilt: PostgresProjectionStore,
    dsn: str,
) -> None:
    runs = side_effects(dsn, live.schema)
    effects = Counter((sid, call_id) for sid, call_id, name, _ in runs if name == "alert")
    delivered = Counter((sid, call_id) for sid, call_id, _ in deliveries(dsn, live.schema))
    outcomes: Counter[str] = Counter()
    for sid, texts in expected.items():
        events = await producer.read_session(sid)
        assert [e.version for e in events] == list(range(1, len(events) + 1))
        received = [e.text for e in events if isinstance(e, ev.UserMessageReceived)]
        assert received == texts, sid  # each accepted message sequenced exactly once, in order
        started = [e.message_id for e in events if isinstance(e, ev.TurnStarted)]
        turns = [e for e in events if isinstance(e, ev.TurnFinished)]
        assert started == [t.message_id for t in turns] == [f"{sid}-{t}" for t in texts], sid
        assert all(t.reason == "answered" for t in turns), sid
        answers = [e.text for e in events if isinstance(e, ev.AssistantMessage) and e.text.startswith("done")]
        assert answers == [f"done: {t}" for t in texts], sid
        for text in texts:
            for tool in ("lookup", "notify", "alert"):
                finished = [
                    e for e in events if isinstance(e, ev.ToolCallFinished) and e.call_id == f"{tool}-{text}"
                ]
                assert len(finished) == 1, (sid, tool, text)
                if tool == "notify":  # keyed: run again after a kill, delivered once
                    assert finished[0].status == "success", (sid, text, finished[0].content)
                    assert delivered[(sid, f"notify-{text}")] == 1, (sid, text)
            paged = next(
                e for e in events if isinstance(e, ev.ToolCallFinished) and e.call_id == f"alert-{text}"
            )
            sent = effects[(sid, f"alert-{text}")]
            outcomes[paged.status] += 1
            if paged.status == "success":
                assert sent == 1, (sid, text)  # paged once, recorded once
            else:  # killed between the page and its record: reported, never paged again
                assert paged.status == "interrupted" and sent <= 1, (sid, text, sent)
    assert max(effects.values()) == 1  # no alert was ever sent twice
    await check_ledger(producer, runs)
    assert sum(outcomes.values()) == 2 * SESSIONS
    print(f"alert outcomes: {dict(outcomes)}")
    await Projector(producer, live).catch_up()
    assert await rebuild(producer, rebuilt) > 0
    for name in READ_MODELS:
        assert live.table(name) == rebuilt.table(name), name


async def check_ledger(producer: KafkaEventLog, runs: list[tuple[str, ...]]) -> None:
    """Every tool run got the key its ToolCallStarted put on the log before it ran; a lookup
    retried after a kill got the same key again; no two calls share a key."""
    logged: dict[tuple[str, str], set[str]] = {}
    for sid in {run[0] for run in runs}:
        for e in await producer.read_session(sid):
            if isinstance(e, ev.ToolCallStarted):
                logged.setdefault((sid, e.call_id), set()).add(e.idempotency_key)
    assert all(len(keys) == 1 for keys in logged.values())  # one key per call, over all attempts
    for sid, call_id, name, key in runs:
        if name != "alert":  # alert takes no key; every other run got the key logged for its call
            assert logged[(sid, call_id)] == {key}, (sid, call_id)
    assert len({k for keys in logged.values() for k in keys}) == len(logged)
    retried = Counter((sid, call_id, name) for sid, call_id, name, _ in runs if name != "alert")
    again = Counter(name for (_, _, name), n in retried.items() if n > 1)
    print(f"ledger: {len(runs)} tool runs, run again after a kill with their first key: {dict(again)}")
