"""Erasing a user (issue 43), end to end on both backends: unique strings planted in every kind of
content (messages, tool arguments and results, an approval's edit and note, a summary, a memory
note, a dead-lettered record on Kafka) are found through the API first; after
``DELETE /v1/admin/users/alice`` the raw bytes of every store (the Kafka topics from offset 0,
the SQLite files with their WALs, every row of every PostgreSQL table, the Qdrant folder) hold
none of them, the session still folds, replays and shows with ``[erased]``, a rebuild equals the
live projections, the analytics totals are unchanged, and bob's content is untouched."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from aiokafka import TopicPartition
from psycopg import sql as pgsql

from tests.erasure_support import hits, pg_cipher
from tests.gateway_support import KEYS, POLLING_LIMITS, PRINCIPALS, auth
from tests.services import delete_topics, fresh_topic, need_service, raw_consumer
from turnlog.consumers.memory import MemoryConsumer
from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.admin import SessionAdmin
from turnlog.engine.context.memory import MemoryPolicy
from turnlog.engine.context.policy import ContextPolicy
from turnlog.engine.crypto.cipher import ContentCipher
from turnlog.engine.crypto.fields import ERASED_TEXT
from turnlog.engine.errors import SessionErasedError
from turnlog.engine.log.base import EventLog
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_topics import TopicNames
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.memory.edge import EdgeMemoryStore
from turnlog.engine.memory.embedders import UniversalSentenceEncoder
from turnlog.gateway import Gateway, GatewayConfig, KeyStore, Principal, server_config
from turnlog.projections.postgres import PostgresProjectionStore
from turnlog.projections.rebuild import rebuild
from turnlog.projections.schema import READ_MODELS
from turnlog.projections.store import ProjectionStore, SqliteProjectionStore

WAIT_S = 60.0
PARTITIONS = 2


@tool(idempotent=True)
async def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"order_id": order_id, "note": f"RES-{order_id}"}


@tool(requires_approval=True, sensitivity="high")
async def refund(order_id: str, amount: int) -> dict[str, Any]:
    """Refund an order."""
    return {"refunded": amount, "receipt": f"RCPT-{order_id}"}


def desk_model(request: ModelRequest) -> ModelResponse | str:
    """Per user message (``<WORD> <marker>``): LOOKUP calls lookup, REFUND asks for a refund that
    waits for approval and then remembers a fact, anything else is answered at once."""
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    word, marker = request.messages[last].content.split()[:2]
    results = [m for m in request.messages[last + 1 :] if m.role == "tool"]
    if word == "LOOKUP" and not results:
        return reply("", call("lookup", {"order_id": f"ARG-{marker}"}, "c-lookup"))
    if word == "REFUND" and not results:
        return reply("", call("refund", {"order_id": f"ARGR-{marker}", "amount": 5}, "c-refund"))
    if word == "REFUND" and len(results) == 1:
        fact = {"fact": f"MEMO-{marker} prefers parcels left at the door", "tag": "preference"}
        return reply("", call("remember", fact, "c-remember"))
    return f"ANS-{word}-{marker}"


@dataclass
class Deployment:
    backend: str
    log: EventLog
    store: ProjectionStore
    cipher: ContentCipher
    memory: EdgeMemoryStore
    url: str
    home: Path
    gateway: Gateway
    topic: str = ""
    schemas: list[str] = field(default_factory=list)

    async def raw(self, needles: list[str]) -> dict[str, list[str]]:
        """Where the needles are in raw storage: files, Kafka topics, PostgreSQL rows."""
        found = hits([self.home], needles)
        if self.backend == "kafka":
            blobs = await kafka_bytes(need_service("TURNLOG_KAFKA_BOOTSTRAP"), self.topic)
            blobs += postgres_rows(need_service("TURNLOG_POSTGRES_DSN"), self.schemas)
            for needle in needles:
                where = [name for name, blob in blobs if needle.encode() in blob]
                if where:
                    found.setdefault(needle, []).extend(where)
        return found


@contextlib.asynccontextmanager
async def deployment(
    backend: str, tmp_path: Path, embedder: UniversalSentenceEncoder, summary: str
) -> AsyncIterator[Deployment]:
    home = tmp_path / "home"
    home.mkdir()
    memory = EdgeMemoryStore(embedder, path=str(home / "memory"))
    summarizer = FunctionModel(lambda r: summary, name="summarizer")
    agent = Agent.build(
        "desk",
        FunctionModel(desk_model, name="desk-model"),
        [lookup, refund],
        memory=MemoryPolicy(memory),
        context=ContextPolicy(summarizer=summarizer, verbatim_turns=1),
    )
    agents = AgentDirectory([agent])
    async with _backend(backend, home) as (log, store, cipher, topic, schemas):
        keys = KeyStore.from_plain({KEYS[u]: Principal(u, role) for u, role in PRINCIPALS.items()})
        gw = Gateway(
            log,
            store,
            agents,
            keys,
            GatewayConfig(limits=POLLING_LIMITS, poll_s=0.2, ping_s=5),
            companions=[MemoryConsumer(log, memory, owned_only=backend == "kafka", agent_ids=["desk"])],
        )
        async with on_loopback(gw) as url:
            yield Deployment(backend, log, store, cipher, memory, url, home, gw, topic, schemas)
    await memory.close()


@contextlib.asynccontextmanager
async def _backend(
    backend: str, home: Path
) -> AsyncIterator[tuple[EventLog, ProjectionStore, ContentCipher, str, list[str]]]:
    if backend == "sqlite":
        log = SqliteEventLog(
            home / "log.db", partitions=PARTITIONS, compress=False
        )  # raw bytes show any plaintext
        store = SqliteProjectionStore(home / "projections.db")
        assert isinstance(log.records.sealer, ContentCipher)
        try:
            yield log, store, log.records.sealer, "", []
        finally:
            store.close()
            await log.close()
        return
    bootstrap, dsn = need_service("TURNLOG_KAFKA_BOOTSTRAP"), need_service("TURNLOG_POSTGRES_DSN")
    topic = fresh_topic()
    with pg_cipher(dsn) as cipher:
        kafka = KafkaEventLog(
            bootstrap, topic=topic, partitions=PARTITIONS, session_timeout_ms=6000, sealer=cipher
        )
        store = PostgresProjectionStore(dsn, schema=f"test_{uuid.uuid4().hex[:12]}")
        keys_schema = getattr(cipher.keys, "where", "").rsplit(" ", 1)[-1]
        try:
            await kafka.start()
            await kafka.wait_owned()
            yield kafka, store, cipher, topic, [store.schema, keys_schema]
        finally:
            await kafka.close()
            store.drop_schema()
            store.close()
            await delete_topics(bootstrap, topic)


@contextlib.asynccontextmanager
async def on_loopback(gw: Gateway) -> AsyncIterator[str]:
    """The gateway's app on a real HTTP server on loopback, on this event loop."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(gw.app(), gw.limits, log_level="warning", access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(WAIT_S):
            while not server.started:
                await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def kafka_bytes(bootstrap: str, topic: str) -> list[tuple[str, bytes]]:
    """Every record of every topic of the log, from offset 0, aborted transactions' too."""
    consumer = raw_consumer(bootstrap, "read_uncommitted")
    await consumer.start()
    blobs: list[tuple[str, bytes]] = []
    try:
        cluster = await consumer._client.fetch_all_metadata()  # noqa: SLF001 - every topic's partitions
        for name in TopicNames(topic).all():
            parts = [TopicPartition(name, p) for p in cluster.partitions_for_topic(name) or set()]

            if not parts:
                continue
            consumer.assign(parts)
            ends = await consumer.end_offsets(parts)
            # an explicit seek: seek_to_beginning is applied lazily, and a position read before it
            # lands can still be the "latest" reset of a new assignment (the end: nothing read)
            for tp, start in (await consumer.beginning_offsets(parts)).items():
                consumer.seek(tp, start)
            idle, deadline = 0, time.monotonic() + 60
            while gaps := [g for tp in parts if (g := ends[tp] - await consumer.position(tp)) > 0]:
                # a transaction marker at a partition's end is never returned: one offset short,
                # and nothing more after a few fetches, is the end; anything more is read or fails
                if idle >= 3 and max(gaps) <= 1:
                    break
                assert time.monotonic() < deadline, f"{name}: could not read to the end, {gaps} behind"
                batch = await consumer.getmany(timeout_ms=200, max_records=5000)
                idle = 0 if batch else idle + 1
                for tp, msgs in batch.items():
                    for msg in msgs:
                        where = f"{tp.topic}/{tp.partition}/{msg.offset}"
                        head = b"".join(k.encode() + v for k, v in msg.headers or ())
                        blobs += [(where, msg.value or b""), (f"{where} headers", (msg.key or b"") + head)]
    finally:
        await consumer.stop()
    return blobs


def postgres_rows(dsn: str, schemas: list[str]) -> list[tuple[str, bytes]]:
    """Every row of every table of the schemas, as text."""
    found: list[tuple[str, bytes]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            tables = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
            ).fetchall()
            for (table,) in tables:
                query = pgsql.SQL("SELECT t::text FROM {}.{} t").format(
                    pgsql.Identifier(schema), pgsql.Identifier(table)
                )
                found += [
                    (f"{schema}.{table}", str(row[0]).encode()) for row in conn.execute(query).fetchall()
                ]
    return found


@pytest.fixture(scope="module")
def embedder() -> UniversalSentenceEncoder:
    return UniversalSentenceEncoder()


async def until(condition: Any, what: str) -> Any:
    """Poll ``condition`` (an async callable) until it returns something truthy."""
    async with asyncio.timeout(WAIT_S):
        while not (found := await condition()):
            await asyncio.sleep(0.05)
    return found


async def session_of(client: httpx.AsyncClient, user: str, sid: str) -> dict[str, Any]:
    answer = await client.get(f"/v1/sessions/{sid}", headers=auth(user))
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


async def converse(client: httpx.AsyncClient, user: str, m: str) -> str:
    """A session of three turns: a lookup; a refund approved with an edit and a note, then a memory
    noted; a third turn, whose context summarises the first."""
    created = await client.post("/v1/sessions", json={"agent": "desk"}, headers=auth(user))
    assert created.status_code == 201, created.text
    sid = str(created.json()["session_id"])

    async def turns(n: int) -> Any:
        view = await session_of(client, user, sid)
        return view if view["turns"] >= n and not view["turn_running"] else None

    async def paused() -> Any:
        view = await session_of(client, user, sid)
        return view if view["pending_approvals"] else None

    for n, text in ((1, f"LOOKUP {m}"), (2, f"REFUND {m}"), (3, f"THANKS {m}")):
        posted = await client.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=auth(user))
        assert posted.status_code == 202, posted.text
        if n == 2:
            await until(paused, "the refund waits for approval")
            decision = {
                "decision": "edit",
                "arguments": {"order_id": f"EDIT-{m}", "amount": 7},
                "note": f"NOTE-{m}",
            }
            decided = await client.post(
                f"/v1/sessions/{sid}/approvals/c-refund", json=decision, headers=auth(user)
            )
            assert decided.status_code == 202, decided.text
        await until(lambda n=n: turns(n), f"turn {n}")
    return sid


def alice_strings(m: str) -> list[str]:
    """What alice's conversation plants, each a kind of content."""
    return [
        f"LOOKUP {m}", f"ARG-{m}", f"RES-ARG-{m}", f"ANS-LOOKUP-{m}", f"REFUND {m}", f"ARGR-{m}",
        f"EDIT-{m}", f"NOTE-{m}", f"RCPT-EDIT-{m}", f"MEMO-{m}", f"SUM-{m}", f"ANS-THANKS-{m}",
    ]  # fmt: skip


async def another_process(d: Deployment) -> EventLog:
    """The log as a process of its own opens it: another connection, another cipher (its own
    key cache) on the same key store."""
    if d.backend == "sqlite":
        return SqliteEventLog(d.home / "log.db", partitions=PARTITIONS, compress=False)
    cipher = ContentCipher(d.cipher.keys, d.cipher.master)
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    other = KafkaEventLog(bootstrap, topic=d.topic, partitions=PARTITIONS, owner=False, sealer=cipher)
    await other.start()
    return other


async def dead_letter(d: Deployment, sid: str, m: str) -> str:
    """A decision for a call that waits no more, from a process that owns nothing: the owner
    refuses it to the dead-letter topic (its value sealed as the inbox had it)."""
    text = f"DEADNOTE-{m}"
    other = KafkaEventLog(
        need_service("TURNLOG_KAFKA_BOOTSTRAP"),
        topic=d.topic,
        partitions=PARTITIONS,
        owner=False,
        sealer=d.cipher,
    )
    await other.start()
    try:
        turn = next(e.turn_id for e in await other.read_session(sid) if isinstance(e, ev.ApprovalDecided))
        late = ev.ApprovalDecided(
            session_id=sid,
            version=0,
            turn_id=turn,
            call_id="c-refund",
            decision="rejected",
            arguments_json="{}",
            note=text,
        )
        await other.submit(late)
    finally:
        await other.close()

    async def lettered() -> bool:
        dead = [
            blob
            for name, blob in await kafka_bytes(need_service("TURNLOG_KAFKA_BOOTSTRAP"), d.topic)
            if ".dead-letter/" in name
        ]
        return any(b"tlenc1:" in blob for blob in dead)  # sealed: the note is not in the clear

    await until(lettered, "the refused decision in the dead-letter topic")
    return text


async def snapshot_of(d: Deployment) -> dict[str, Any]:
    """The read models as rows, and the analytics totals."""
    await d.gateway.projector.catch_up()
    await d.gateway.analytics.catch_up()
    tables = {name: d.store.table(name) for name in READ_MODELS}
    totals = d.store._query("SELECT * FROM analytics_daily ORDER BY day")
    tools = d.store._query("SELECT * FROM analytics_daily_tools ORDER BY day, tool_name")
    return {"tables": tables, "analytics": totals, "tools": tools}


@pytest.mark.parametrize("backend", ["sqlite", "kafka"])
async def test_erasing_a_user_leaves_no_content_anywhere(
    backend: str, tmp_path: Path, embedder: UniversalSentenceEncoder
) -> None:
    m, b = f"zq{uuid.uuid4().hex[:10]}", f"bq{uuid.uuid4().hex[:10]}"
    async with deployment(backend, tmp_path, embedder, f"SUM-{m}") as d:
        async with httpx.AsyncClient(base_url=d.url, timeout=30) as client:
            alice, bob = await converse(client, "alice", m), await converse(client, "bob", b)
            planted = alice_strings(m)
            if backend == "kafka":
                planted.append(await dead_letter(d, alice, m))
            await until(lambda: d.memory.search("alice", "parcels left at the door"), "alice's memory stored")
            await until(lambda: d.memory.search("bob", "parcels left at the door"), "bob's memory stored")

            # before: every planted string is found through the API (the dead letter opens with the key)
            seen = json.dumps(
                (await client.get(f"/v1/sessions/{alice}/timeline", headers=auth("alice"))).json()
            )
            seen += json.dumps([x.text for x in await d.memory.search("alice", "parcels left at the door")])
            if backend == "kafka":
                seen += json.dumps([await _dead_letters_opened(d)])
            assert [s for s in planted if s not in seen] == []
            assert (await d.raw([m]))[m], "the scan sees plaintext where it is (projections, memory)"
            before = await snapshot_of(d)
            other = await another_process(d)  # its own caches: it read alice's content before
            assert m in repr(await other.read_session(alice))

            erased = await client.delete(
                "/v1/admin/users/alice", params={"reason": "GDPR Art. 17"}, headers=auth("root")
            )
            assert erased.status_code == 200, erased.text
            report = erased.json()
            assert (report["scope"], report["subject"], report["state"]) == ("user", "alice", "done")
            assert report["erased_now"] >= 1 and report["unerasable"] == []
            again = await client.delete("/v1/admin/users/alice", headers=auth("root"))
            assert again.status_code == 200 and again.json()["erased_now"] == 0  # idempotent

            # after: nothing of alice's in any store's raw bytes; bob's content untouched
            assert await d.raw([m, *planted]) == {}
            bob_seen = json.dumps(
                (await client.get(f"/v1/sessions/{bob}/timeline", headers=auth("bob"))).json()
            )
            assert [s for s in alice_strings(b) if s not in bob_seen and not s.startswith("SUM")] == []
            assert [x.text for x in await d.memory.search("bob", "parcels left at the door")]
            assert await d.memory.search("alice", "parcels left at the door") == []

            # another process that had read the session reads it erased now (it dropped its keys
            # and, on Kafka, scrubbed what its partition index held when it read the erasure)
            assert m not in repr(await other.read_session(alice))
            await other.close()
            # the session still folds (the gateway's cached fold scrubbed too), replays and shows
            cached = await d.gateway.api.get_state(alice)
            assert {m.content for m in cached.messages if m.content} == {ERASED_TEXT}
            timeline = (await client.get(f"/v1/sessions/{alice}/timeline", headers=auth("alice"))).json()
            contents = [r["content"] for r in timeline["messages"] if r["content"]]
            assert contents and set(contents) == {ERASED_TEXT} and m not in json.dumps(timeline)
            assert any(e["type"] == "SessionErased" for e in timeline["events"])
            replayed = [step.event async for step in SessionAdmin(d.log).replay(alice)]
            texts = [
                e.text
                for e in replayed
                if isinstance(e, ev.UserMessageReceived | ev.AssistantMessage) and e.text
            ]
            assert texts and set(texts) == {ERASED_TEXT}
            assert (await client.get("/viewer")).status_code == 200
            with pytest.raises(SessionErasedError):
                await SessionAdmin(d.log).fork(alice, timeline["session"]["state_version"] - 1)
            refused = await client.post(
                f"/v1/sessions/{alice}/messages", json={"text": "hello"}, headers=auth("alice")
            )
            assert refused.status_code == 409 and refused.json()["error"] == "session_closed"

            # metadata survives: analytics totals, tokens and costs; the projections equal a rebuild
            after = await snapshot_of(d)
            assert after["analytics"] == before["analytics"] and after["tools"] == before["tools"]
            for name in ("model_calls", "turns"):
                assert [_metadata(r) for r in after["tables"][name]] == [
                    _metadata(r) for r in before["tables"][name]
                ]
            assert after["tables"] == await _rebuilt(d, tmp_path)


async def _dead_letters_opened(d: Deployment) -> list[str]:
    """The dead-letter topic's records, decoded through the cipher (what an operator reading it sees)."""
    from turnlog.engine.log.sealing import RecordCodec

    opened: list[str] = []
    records = RecordCodec(d.cipher)
    for name, blob in await kafka_bytes(need_service("TURNLOG_KAFKA_BOOTSTRAP"), d.topic):
        if ".dead-letter/" in name and not name.endswith("headers"):
            opened.append(repr(records.decode(blob)))
    return opened


def _metadata(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        row.get(k) for k in ("turn_id", "step", "input_tokens", "output_tokens", "cost_micros", "outcome")
    )


async def _rebuilt(d: Deployment, tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The read models refolded from offset 0 into a fresh store."""
    if d.backend == "sqlite":
        fresh: ProjectionStore = SqliteProjectionStore(tmp_path / "rebuilt.db")
    else:
        fresh = PostgresProjectionStore(
            need_service("TURNLOG_POSTGRES_DSN"), schema=f"test_{uuid.uuid4().hex[:12]}"
        )
    try:
        await rebuild(d.log, fresh)
        return {name: fresh.table(name) for name in READ_MODELS}
    finally:
        if isinstance(fresh, PostgresProjectionStore):
            fresh.drop_schema()
        fresh.close()
