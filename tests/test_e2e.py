"""End to end on the real services: one `turnlog serve --kafka --postgres --no-worker
--no-projector` process, two `turnlog worker` processes and a `turnlog projector`, all with the
user agent of tests/agentpkg/e2e.py loaded through `--agents`. 100 sessions of 20 users post over
HTTP and follow their turns over SSE: plain tool turns, refunds approved, edited or rejected,
turns cancelled and turns interrupted by a new message. Mid-run one worker is SIGKILLed and
another started.

Then: every accepted message had exactly one turn (ending as it should), no non-idempotent tool
ran twice, every SSE stream saw every committed event of its session once and in log order, the
projections the projector kept equal a rebuild from offset 0, and another user's requests for
these sessions were answered 404 throughout.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
import psycopg

from tests.agentpkg.e2e import AGENT, SIDE_EFFECTS
from tests.deployment import Program, program_env, wait_answering, write_keys
from tests.gateway_support import SseMessage, sse_messages
from tests.openai_server import free_port
from tests.services import delete_topics, fresh_topic, need_service, postgres_store
from turnlog.engine import events as ev
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.projections import PostgresProjectionStore, rebuild
from turnlog.projections.schema import READ_MODELS

PARTITIONS = 4
USERS = [f"user{i:02d}" for i in range(20)]
KINDS = ["plain"] * 5 + ["approve", "edit", "reject", "cancel", "interrupt"]
"""What the sessions do: 100 sessions = 10 of each of these (half of them steered)."""
SESSIONS = 100
CONCURRENT = 30
KILL_AFTER = 35
"""Sessions finished before the first worker is SIGKILLed (and a third started)."""
WAIT_S = 180.0
"""Bound on any one wait (a takeover after the kill waits for the dead member's group session)."""


def key(user: str) -> str:
    return f"tlk_{user}_e2e_key_0123456789abcdef"


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key(user)}"}


@dataclass
class Run:
    """One session's driver: what it posted, what its stream showed."""

    user: str
    kind: str
    sid: str = ""
    posted: list[str] = field(default_factory=list)
    """Message texts accepted (202), in order."""
    seen: list[SseMessage] = field(default_factory=list)
    turns: int = 1


class Deployment:
    def __init__(self, tmp_path: Path, bootstrap: str, topic: str, dsn: str, live: str) -> None:
        self.tmp = tmp_path
        self.release = tmp_path / "release"
        self.release.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_args = ["--kafka", bootstrap, "--topic", topic, "--partitions", str(PARTITIONS)]
        self.env = program_env(
            TURNLOG_E2E_DSN=dsn, TURNLOG_E2E_SCHEMA=live, TURNLOG_E2E_RELEASE=str(self.release)
        )
        agents = ["--agents", "tests.agentpkg.e2e:directory"]
        serve = ["serve", "--home", str(tmp_path / "gateway"), "--port", str(self.port), "--keys",
                 str(tmp_path / "keys.toml"), *log_args, "--postgres", dsn, "--schema", live,
                 "--no-worker", "--no-projector", *agents]  # fmt: skip
        self.gateway = self.program("gateway", serve)
        self.projector = self.program(
            "projector", ["projector", *log_args, "--postgres", dsn, "--schema", live]
        )
        self.worker_args = [*log_args, *agents, "--no-memory"]
        self.reader: KafkaEventLog | None = None
        """Set by the test: a failed wait says what the log holds for its session."""
        self.workers = [self.worker(n) for n in (1, 2)]

    def program(self, name: str, args: list[str]) -> Program:
        return Program(name, args, self.tmp / f"{name}.log", env=self.env)

    def worker(self, n: int) -> Program:
        home = self.tmp / f"w{n}"
        return self.program(
            f"worker-{n}", ["worker", "--id", f"w{n}", "--home", str(home), *self.worker_args]
        )

    def start(self) -> None:
        for program in (self.projector, *self.workers, self.gateway):
            program.start()

    def stop(self) -> None:
        for program in (self.gateway, *self.workers, self.projector):
            program.stop()

    async def on_log(self, session_id: str) -> list[tuple[str, str]]:
        """The session's events on the log (type, producer): did a worker stall, or the stream?"""
        if self.reader is None:
            return []
        return [(type(e).__name__, e.producer) for e in await self.reader.read_session(session_id)]

    def alive(self) -> None:
        for program in (self.gateway, self.projector, *[w for w in self.workers if w.name != "worker-1"]):
            program.check_alive()


async def test_a_deployment_on_kafka_and_postgres_with_a_worker_killed(tmp_path: Path) -> None:
    bootstrap, dsn = need_service("TURNLOG_KAFKA_BOOTSTRAP"), need_service("TURNLOG_POSTGRES_DSN")
    write_keys(tmp_path / "keys.toml", {u: (key(u), "user") for u in [*USERS, "mallory"]})
    topic = fresh_topic()
    with postgres_store(dsn) as live, postgres_store(dsn) as rebuilt:
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={live.schema}") as conn:
            conn.execute(SIDE_EFFECTS)
        deployment = Deployment(tmp_path, bootstrap, topic, dsn, live.schema)
        reader = KafkaEventLog(bootstrap, topic=topic, partitions=PARTITIONS, owner=False)
        deployment.reader = reader
        try:
            deployment.start()
            await reader.start()
            await wait_answering(deployment.url, key(USERS[0]), deployment.gateway)
            runs = await drive(deployment)
            await check(reader, runs, live, rebuilt, dsn, deployment)
        finally:
            deployment.stop()
            await reader.close()
            await delete_topics(bootstrap, topic)


async def drive(deployment: Deployment) -> list[Run]:
    rng = random.Random(18)
    runs = [Run(USERS[i % len(USERS)], KINDS[i % len(KINDS)]) for i in range(SESSIONS)]
    rng.shuffle(runs)
    finished: list[Run] = []
    killed = asyncio.Event()
    gate = asyncio.Semaphore(CONCURRENT)
    limits = httpx.Limits(max_connections=CONCURRENT * 2 + 10)
    async with httpx.AsyncClient(base_url=deployment.url, timeout=WAIT_S, limits=limits) as client:

        async def one(run: Run) -> None:
            async with gate:
                await session(client, deployment, run)
            finished.append(run)
            if len(finished) == KILL_AFTER and not killed.is_set():
                killed.set()
                deployment.workers[0].kill()  # mid-run: other sessions have turns in flight
                deployment.workers.append(deployment.worker(3).start())
                await mallory_is_refused(client, [r.sid for r in finished])

        await asyncio.gather(*(one(run) for run in runs))
        await mallory_is_refused(client, [r.sid for r in runs])
    assert killed.is_set()
    return runs


async def session(client: httpx.AsyncClient, deployment: Deployment, run: Run) -> None:
    created = await client.post("/v1/sessions", json={"agent": AGENT}, headers=auth(run.user))
    assert created.status_code == 201, created.text
    run.sid = created.json()["session_id"]
    async with client.stream("GET", f"/v1/sessions/{run.sid}/events", headers=auth(run.user)) as response:
        assert response.status_code == 200
        stream = sse_messages(response)
        await until(stream, run, lambda m: m.event == "SessionCreated", deployment)
        text = {"plain": "plain", "cancel": "slow", "interrupt": "slow"}.get(run.kind, "refund")
        await post(client, run, "messages", {"text": f"{text} {run.sid[:8]}"})
        if run.kind in ("approve", "edit", "reject"):
            await decide(client, run, await until(stream, run, kind("ApprovalRequested"), deployment))
        elif run.kind in ("cancel", "interrupt"):
            await until(stream, run, lambda m: m.event == "ToolCallStarted", deployment)
            if run.kind == "cancel":
                await post(client, run, "cancel", {"reason": "no longer needed"})
            else:
                await post(client, run, "interrupt", {"text": f"plain again-{run.sid[:8]}"}, accepted=True)
                run.turns = 2
            await until(stream, run, kind("CancelRequested"), deployment)
            (deployment.release / run.sid).touch()  # the held tool returns: the step boundary
        await until(stream, run, turn_end(run), deployment)


async def decide(client: httpx.AsyncClient, run: Run, waiting: SseMessage) -> None:
    body: dict[str, Any] = {"decision": run.kind}
    if run.kind == "edit":
        body["arguments"] = {**json.loads(waiting.json["arguments_json"]), "amount": 25}
    await post(client, run, f"approvals/{waiting.json['call_id']}", body)


async def post(
    client: httpx.AsyncClient, run: Run, route: str, body: dict[str, Any], accepted: bool = False
) -> None:
    response = await client.post(f"/v1/sessions/{run.sid}/{route}", json=body, headers=auth(run.user))
    assert response.status_code == 202, (route, response.text)
    if route == "messages" or accepted:
        run.posted.append(body["text"])


def kind(name: str) -> Callable[[SseMessage], bool]:
    return lambda m: m.event == name


def turn_end(run: Run) -> Callable[[SseMessage], bool]:
    """The snapshot after the session's last expected TurnFinished: its turn's last commit."""
    return lambda m: (
        m.event == "SnapshotTaken" and sum(x.event == "TurnFinished" for x in run.seen) >= run.turns
    )


async def until(
    stream: Any, run: Run, stop: Callable[[SseMessage], bool], deployment: Deployment
) -> SseMessage:
    async def read() -> SseMessage:
        async for message in stream:
            run.seen.append(message)
            if stop(message):
                return message
        raise AssertionError(f"{run.sid}: the stream ended; saw {[m.event for m in run.seen]}")

    try:
        return await asyncio.wait_for(read(), WAIT_S)
    except TimeoutError:
        deployment.alive()
        on_log = await deployment.on_log(run.sid)
        raise AssertionError(  # noqa: B904 (the timeout says nothing more)
            f"{run.kind} session {run.sid} waited {WAIT_S:g} s; saw {[m.event for m in run.seen]}; "
            f"the log holds {on_log}"
        )


async def mallory_is_refused(client: httpx.AsyncClient, sids: list[str]) -> None:
    """Another user's requests for these sessions: 404, as for a session that does not exist."""
    for sid in sids[:6]:
        for method, path, body in [
            ("GET", f"/v1/sessions/{sid}", None),
            ("GET", f"/v1/sessions/{sid}/history", None),
            ("POST", f"/v1/sessions/{sid}/messages", {"text": "plain mine"}),
            ("POST", f"/v1/sessions/{sid}/cancel", {}),
        ]:
            response = await client.request(method, path, json=body, headers=auth("mallory"))
            assert response.status_code == 404, (path, response.status_code, response.text)
            assert response.json()["error"] == "not_found"


async def check(
    reader: KafkaEventLog,
    runs: list[Run],
    live: PostgresProjectionStore,
    rebuilt: PostgresProjectionStore,
    dsn: str,
    deployment: Deployment,
) -> None:
    with psycopg.connect(dsn, options=f"-c search_path={live.schema}") as conn:
        effects = Counter(
            (sid, call_id) for sid, call_id in conn.execute("SELECT session_id, call_id FROM side_effects")
        )
    assert effects and max(effects.values()) == 1  # no non-idempotent tool ever ran twice
    outcomes: Counter[str] = Counter()
    for run in runs:
        records = await reader.read_session_records(run.sid)
        events = [r.event for r in records]
        assert [e.version for e in events] == list(range(1, len(events) + 1))
        received = [e for e in events if isinstance(e, ev.UserMessageReceived)]
        assert [e.text for e in received] == run.posted, run.sid  # each accepted message once
        started = [e.message_id for e in events if isinstance(e, ev.TurnStarted)]
        ended = [e for e in events if isinstance(e, ev.TurnFinished)]
        assert started == [t.message_id for t in ended] == [e.message_id for e in received], run.sid
        reasons = [t.reason for t in ended]
        expected = {"cancel": ["cancelled"], "interrupt": ["cancelled", "answered"]}.get(
            run.kind, ["answered"]
        )
        assert reasons == expected, (run.kind, run.sid, reasons)
        check_tools(run, events, effects, outcomes)
        streamed = [m.id for m in run.seen if m.id is not None]
        assert streamed == [r.offset for r in records if r.offset <= streamed[-1]], run.sid  # once, in order
        assert streamed[-1] == records[-1].offset, run.sid  # up to the session's last event
    print(f"non-idempotent runs: {dict(outcomes)}; workers: {[w.name for w in deployment.workers]}")
    await projections_caught_up(reader, runs, live, deployment)
    assert await rebuild(reader, rebuilt) > 0
    for name in READ_MODELS:
        assert live.table(name) == rebuilt.table(name), name


def check_tools(
    run: Run, events: list[ev.Event], effects: Counter[tuple[str, str]], outcomes: Counter[str]
) -> None:
    """Each non-idempotent call finished once: run once if it succeeded, at most once if a kill
    cut it short (interrupted), never if rejected."""
    for finished in (e for e in events if isinstance(e, ev.ToolCallFinished)):
        if finished.tool_name not in ("notify", "refund"):
            continue
        sent = effects[(run.sid, finished.call_id)]
        outcomes[f"{finished.tool_name}:{finished.status}"] += 1
        if finished.status == "success":
            assert sent == 1, (run.sid, finished.call_id)
        elif finished.status == "declined":
            assert run.kind == "reject" and sent == 0, (run.sid, finished.status)
        else:
            assert finished.status == "interrupted" and sent <= 1, (run.sid, finished.status, sent)
    calls = Counter(e.call_id for e in events if isinstance(e, ev.ToolCallFinished))
    assert max(calls.values(), default=1) == 1, run.sid
    if run.kind == "edit":
        decided = next(e for e in events if isinstance(e, ev.ApprovalDecided))
        assert decided.decision == "edited" and json.loads(decided.arguments_json)["amount"] == 25


async def projections_caught_up(reader: KafkaEventLog, runs: list[Run], live: PostgresProjectionStore,
                                deployment: Deployment) -> None:  # fmt: skip
    """Wait until the projector process has every session at its last version on the log."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    for run in runs:
        version = await reader.session_version(run.sid)
        while (row := live.session(run.sid)) is None or int(row["state_version"]) < version:
            deployment.projector.check_alive()
            assert loop.time() < deadline, f"the projector never reached {run.sid} v{version}"
            await asyncio.sleep(0.2)
