"""The gateway on Kafka + PostgreSQL as a deployment runs it: `turnlog serve --kafka --postgres
--no-worker --agents ...` in its own process, owning no partition, and the turns run by a worker
in another process (here the test's, with its live publisher). Every route works as embedded:
a session is readable the moment it is created, token deltas reach the stream through the live
topic, an interrupt, an approval and a fork go through the inbox, another user's session is 404,
and a stream resumed after a gateway restart gets exactly the events after its Last-Event-ID."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from tests.agentpkg import desk
from tests.deployment import Program, wait_answering, write_keys
from tests.gateway_support import SseMessage, read_until, sse_messages
from tests.openai_server import free_port
from tests.services import delete_topics, fresh_topic, need_service, postgres_store
from turnlog.consumers import TurnWorker
from turnlog.distributed import LiveLinks
from turnlog.engine import events as ev
from turnlog.engine.log.kafka import KafkaEventLog
from turnlog.engine.log.kafka_held import DEFAULT_INDEX_BYTES

PARTITIONS = 2
KEYS = {
    "alice": ("tlk_alice_kafka_0123456789abcdef", "user"),
    "bob": ("tlk_bob_kafka_0123456789abcdefg", "user"),
    "root": ("tlk_root_kafka_0123456789abcdef", "admin"),
}
TIMEOUT = httpx.Timeout(30.0)


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[user][0]}"}


@contextlib.asynccontextmanager
async def desk_worker(bootstrap: str, topic: str) -> AsyncIterator[KafkaEventLog]:
    """The desk agent's turn worker in this process: owns every partition, publishes live items
    (each event with its offset, the messages it sequences too)."""
    log = KafkaEventLog(
        bootstrap, topic=topic, partitions=PARTITIONS, client_id="desk-worker", session_timeout_ms=6000
    )
    await log.start()
    links = LiveLinks()  # as turnlog worker wires them: the gateway streams events before reading them
    await links.start(log, publish=True, subscribe=False)
    assert links.publisher is not None
    worker = TurnWorker(log, desk.directory(), worker_id="desk-worker", on_item=links.publisher.publish)
    running = asyncio.create_task(worker.run())
    try:
        await log.wait_owned()
        yield log
    finally:
        worker.stop()
        await running
        await links.close()
        await log.close()


def serve(tmp_path: Path, bootstrap: str, topic: str, dsn: str, schema: str, port: int, name: str) -> Program:
    args = ["serve", "--home", str(tmp_path / "home"), "--port", str(port), "--keys",
            str(tmp_path / "keys.toml"), "--kafka", bootstrap, "--topic", topic, "--partitions",
            str(PARTITIONS), "--postgres", dsn, "--schema", schema, "--no-worker",
            "--agents", "tests.agentpkg.desk:directory"]  # fmt: skip
    return Program(name, args, tmp_path / f"{name}.log").start()


async def test_every_route_on_kafka_with_the_turns_in_another_process(tmp_path: Path) -> None:
    bootstrap, dsn = need_service("TURNLOG_KAFKA_BOOTSTRAP"), need_service("TURNLOG_POSTGRES_DSN")
    write_keys(tmp_path / "keys.toml", KEYS)
    topic, port = fresh_topic(), free_port()
    url = f"http://127.0.0.1:{port}"
    desk.REFUNDS.clear()
    with postgres_store(dsn) as store:
        try:
            async with desk_worker(bootstrap, topic) as log:
                gateway = serve(tmp_path, bootstrap, topic, dsn, store.schema, port, "gateway-1")
                try:
                    await wait_answering(url, KEYS["alice"][0], gateway)
                    sid, resume_at = await first_gateway(url, log)
                finally:
                    gateway.stop()
                gateway = serve(tmp_path, bootstrap, topic, dsn, store.schema, port, "gateway-2")
                try:
                    await wait_answering(url, KEYS["alice"][0], gateway)
                    await after_a_restart(url, log, sid, resume_at)
                finally:
                    gateway.stop()
        finally:
            await delete_topics(bootstrap, topic)


async def first_gateway(url: str, log: KafkaEventLog) -> tuple[str, int]:
    """Create, stream a turn with its deltas, interrupt a paused turn, approve; returns the
    session and the position to resume a stream from."""
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        created = await client.post("/v1/sessions", json={"agent": "desk"}, headers=auth("alice"))
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        assert created.json()["position"] is not None  # on the log before the answer: readable now
        assert (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).status_code == 200
        seen: list[SseMessage] = []
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            stream = sse_messages(response)
            await read_until(stream, lambda m: m.event == "SessionCreated", seen)
            posted = await post(client, sid, "messages", {"text": "Where is A-17?"})
            assert posted["position"] is None  # accepted into the inbox; the owner sequences it
            await read_until(stream, turn_end(seen, 1), seen)
            check_deltas(seen)

            await post(client, sid, "messages", {"text": "Please refund A-17."})
            waiting = await read_until(stream, lambda m: m.event == "ApprovalRequested", seen)
            await post(client, sid, "interrupt", {"text": "Where is A-17 now?"})  # cancel + message
            await read_until(stream, turn_end(seen, 3), seen)

            await post(client, sid, "messages", {"text": "Refund A-17 after all."})
            waiting = await read_until(
                stream,
                lambda m: m.event == "ApprovalRequested" and m.json["call_id"] != waiting.json["call_id"],
                seen,
            )
            call_id = waiting.json["call_id"]
            for user, path in [("bob", f"/v1/sessions/{sid}"), ("bob", f"/v1/sessions/{sid}/events")]:
                assert (await client.get(path, headers=auth(user))).status_code == 404
            refused = await client.post(
                f"/v1/sessions/{sid}/approvals/{call_id}", json={"decision": "approve"}, headers=auth("bob")
            )
            assert refused.status_code == 404
            (decided,) = (await post(client, sid, f"approvals/{call_id}", {"decision": "approve"}))["events"]
            assert (decided["type"], decided["position"]) == ("ApprovalDecided", None)
            await read_until(stream, turn_end(seen, 4), seen)
    assert desk.REFUNDS == [{"order_id": "A-17", "amount": 40}]  # the interrupted one never ran
    events = await log.read_session(sid)
    assert [m.id for m in seen if m.id is not None] == [r.offset for r in await log.read_session_records(sid)]
    turns = [e.reason for e in events if isinstance(e, ev.TurnFinished)]
    assert turns == ["answered", "cancelled", "answered", "answered"]
    resume_at = next(m.id for m in seen if m.event == "TurnStarted" and m.id is not None)
    return sid, resume_at


async def after_a_restart(url: str, log: KafkaEventLog, sid: str, resume_at: int) -> None:
    """A new gateway process: the stream resumes after Last-Event-ID; fork and finish work."""
    expected = [r.offset for r in await log.read_session_records(sid) if r.offset > resume_at]
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
        seen: list[SseMessage] = []
        headers = {**auth("alice"), "Last-Event-ID": str(resume_at)}
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=headers) as response:
            await read_until(sse_messages(response), lambda m: m.id == expected[-1], seen)
        assert [m.id for m in seen if m.id is not None] == expected  # each once, nothing before

        turn = next(e for e in await log.read_session(sid) if isinstance(e, ev.ModelCallStarted))
        for user, path in [
            ("alice", "/v1/sessions"),
            ("alice", f"/v1/sessions/{sid}/history"),
            ("alice", f"/v1/sessions/{sid}/timeline"),
            ("alice", f"/v1/sessions/{sid}/model_calls/{turn.turn_id}/{turn.step}"),
            ("root", f"/v1/admin/sessions/{sid}/replay"),
            ("root", "/v1/admin/sessions"),
            ("root", "/v1/admin/analytics/daily"),
            ("root", "/metrics"),
        ]:
            read = await client.get(path, headers=auth(user))
            assert read.status_code == 200, (path, read.text)
            if path == "/metrics":  # with what its Kafka log holds (consumers/log_metrics.py)
                assert f"turnlog_kafka_index_budget_bytes {DEFAULT_INDEX_BYTES}\n" in read.text
        snapshots = (await client.get(f"/v1/admin/sessions/{sid}/snapshots", headers=auth("root"))).json()
        version = snapshots["snapshots"][-1]["version"]
        forked = await client.post(
            f"/v1/admin/sessions/{sid}/fork", json={"version": version}, headers=auth("root")
        )
        assert forked.status_code == 201, forked.text
        fork = forked.json()
        assert (fork["version"], fork["user_id"]) == (1, "alice") and fork["position"] is not None
        assert (
            await client.get(f"/v1/sessions/{fork['session_id']}", headers=auth("alice"))
        ).status_code == 200

        finished = await client.post(
            f"/v1/admin/sessions/{sid}/finish", json={"reason": "done"}, headers=auth("root")
        )
        assert finished.status_code == 200 and finished.json()["closed"] is True, finished.text
    assert isinstance((await log.read_session(sid))[-1], (ev.SessionClosed, ev.SnapshotTaken))


async def test_an_interrupt_stops_a_message_the_owner_has_not_sequenced_yet(tmp_path: Path) -> None:
    """A message posted a moment before an interrupt may still be in the inbox, not on the log
    the gateway reads: the interrupt's cancel goes through the inbox behind it anyway, so the
    owner drops that message (or stops its turn) and only the interrupting message is answered."""
    bootstrap, dsn = need_service("TURNLOG_KAFKA_BOOTSTRAP"), need_service("TURNLOG_POSTGRES_DSN")
    write_keys(tmp_path / "keys.toml", KEYS)
    topic, port = fresh_topic(), free_port()
    url = f"http://127.0.0.1:{port}"
    with postgres_store(dsn) as store:
        gateway = serve(tmp_path, bootstrap, topic, dsn, store.schema, port, "gateway")
        try:
            async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
                async with desk_worker(bootstrap, topic):
                    await wait_answering(url, KEYS["alice"][0], gateway)
                    created = await client.post("/v1/sessions", json={"agent": "desk"}, headers=auth("alice"))
                    sid = created.json()["session_id"]
                # no worker now: what the gateway posts waits in the inbox, off the log it reads
                first = await post(client, sid, "messages", {"text": "Where is A-17?"})
                interrupt = asyncio.create_task(post(client, sid, "interrupt", {"text": "Where is B-9?"}))
                await asyncio.sleep(1.0)
                assert not interrupt.done()  # its cancel waits for an owner to apply it
                async with desk_worker(bootstrap, topic) as log:
                    answer = await interrupt
                    events = await until_answered(log, sid)
        finally:
            gateway.stop()
            await delete_topics(bootstrap, topic)
    stopped = answer["stopped_turn"] is not None
    assert answer["dropped"] == ([] if stopped else [first["message_id"]])
    assert sum(isinstance(e, ev.CancelRequested) for e in events) == 1
    texts = [e.text for e in events if isinstance(e, ev.UserMessageReceived)]
    assert texts == ["Where is A-17?", "Where is B-9?"]
    turns = [e.reason for e in events if isinstance(e, ev.TurnFinished)]
    assert turns == (["cancelled", "answered"] if stopped else ["answered"])


async def until_answered(log: KafkaEventLog, sid: str) -> list[ev.Event]:
    """The session's events once a turn of it has been answered (at most 30 s)."""
    async with asyncio.timeout(30):
        while True:
            events = await log.read_session(sid)
            if any(isinstance(e, ev.TurnFinished) and e.reason == "answered" for e in events):
                return events
            await asyncio.sleep(0.1)


async def post(client: httpx.AsyncClient, sid: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(f"/v1/sessions/{sid}/{route}", json=body, headers=auth("alice"))
    assert response.status_code == 202, response.text
    answer: dict[str, Any] = response.json()
    return answer


def turn_end(seen: list[SseMessage], n: int) -> Any:
    """Stop at the snapshot written after the n-th TurnFinished (the turn's last commit)."""
    return lambda m: m.event == "SnapshotTaken" and sum(x.event == "TurnFinished" for x in seen) >= n


def check_deltas(seen: list[SseMessage]) -> None:
    """The answer's tokens came through the live topic, inside their model call, in order."""
    marks = [m for m in seen if m.event in ("ModelCallStarted", "ModelCallFinished", "delta")]
    assert any(m.event == "delta" for m in marks), [m.event for m in seen]
    for i, mark in enumerate(marks):
        if mark.event == "delta":
            assert [m.event for m in marks[:i] if m.event != "delta"][-1] == "ModelCallStarted"
    assert "".join(m.json["text"] for m in marks if m.event == "delta") == desk.ANSWER


async def test_serve_on_kafka_with_its_own_worker(tmp_path: Path) -> None:
    """`turnlog serve --kafka --postgres` (worker and projector in the process: a member of the
    owners' group) answers a turn with its deltas, and its projections follow."""
    bootstrap, dsn = need_service("TURNLOG_KAFKA_BOOTSTRAP"), need_service("TURNLOG_POSTGRES_DSN")
    write_keys(tmp_path / "keys.toml", KEYS)
    topic, port = fresh_topic(), free_port()
    url = f"http://127.0.0.1:{port}"
    with postgres_store(dsn) as store:
        args = ["serve", "--home", str(tmp_path / "home"), "--port", str(port), "--keys",
                str(tmp_path / "keys.toml"), "--kafka", bootstrap, "--topic", topic, "--partitions",
                str(PARTITIONS), "--postgres", dsn, "--schema", store.schema,
                "--agents", "tests.agentpkg.desk:directory"]  # fmt: skip
        gateway = Program("gateway", args, tmp_path / "gateway.log").start()
        try:
            await wait_answering(url, KEYS["alice"][0], gateway)
            async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
                created = await client.post("/v1/sessions", json={"agent": "desk"}, headers=auth("alice"))
                assert created.status_code == 201, created.text
                sid = created.json()["session_id"]
                seen: list[SseMessage] = []
                async with client.stream(
                    "GET", f"/v1/sessions/{sid}/events", headers=auth("alice")
                ) as response:
                    stream = sse_messages(response)
                    await read_until(stream, lambda m: m.event == "SessionCreated", seen)
                    posted = await post(client, sid, "messages", {"text": "Where is A-17?"})
                    assert posted["position"] is not None  # the owner sequenced it before answering
                    await read_until(stream, turn_end(seen, 1), seen)
                check_deltas(seen)
                session = (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).json()
                assert (session["turns"], session["current_state"]) == (1, "FINISHED")
        finally:
            gateway.stop()
            await delete_topics(bootstrap, topic)
    assert "gateway-worker" in {m.json.get("producer") for m in seen}
