"""Crossed messages (seed §7.3): many producers hammer many sessions at once, two messages to
one session within milliseconds of each other, while two turn workers run the turns.

Each producer is a thread with its own event loop and its own connection to the log file (as
separate gateway processes would be). Afterwards every session's history is checked for
entries of other sessions and for turns that saw more than their own message.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from pathlib import Path

from turnlog.consumers import TurnWorker
from turnlog.consumers.turn_worker import GROUP
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    SqliteEventLog,
    Tool,
    call,
    reply,
    tool,
)
from turnlog.engine import events as ev

SESSIONS = 120
PAIRS = 3  # producer threads come in pairs; both of a pair write to the same sessions
PER_PRODUCER = 2  # messages each producer sends to each of its sessions
PARTITIONS = 4
WAIT_S = 240.0


def stamp_tool(log: SqliteEventLog, second_round: threading.Event) -> Tool:
    """The stamp tool. The first call of the test opens the producers' second round and holds
    its turn until one of those messages is on the log, so at least one turn is certainly
    rebased over a message that arrived mid-turn, however the threads are scheduled."""

    @tool(idempotent=True)
    async def stamp(tag: str) -> str:
        """Stamp a tag (the tool result names the session and message it was run for)."""
        if not second_round.is_set():
            second_round.set()
            await until_second_round_message(log, tag.split(":")[0])
        return f"stamped {tag}"

    return stamp


async def until_second_round_message(log: SqliteEventLog, sid: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        events = await log.read_session(sid)
        texts = [e.text for e in events if isinstance(e, ev.UserMessageReceived)]
        if any(t.endswith(":1") for t in texts):
            return
        await asyncio.sleep(0.02)


def echo(request: ModelRequest) -> ModelResponse | str:
    """Stamps the last user message's tag with the tool, then acknowledges it."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    tag = request.messages[last_user].content.removeprefix("msg ")
    done = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if not done:
        return reply("", call("stamp", {"tag": tag}, f"c-{tag}"))
    return f"ack {tag} after {done[0].content}"


def produce(
    path: Path,
    name: str,
    sids: list[str],
    agents: AgentDirectory,
    second_round: threading.Event,
    errors: list[BaseException],
) -> None:
    async def run() -> None:
        log = SqliteEventLog(path, partitions=PARTITIONS)
        api = AgentSessions(log, agents, producer=name)
        try:
            for k in range(PER_PRODUCER):
                if k == 1:  # the second round waits for the first tool call (see stamp_tool)
                    await asyncio.to_thread(second_round.wait, WAIT_S)
                for sid in sids:
                    await api.post_user_message(sid, f"msg {sid}:{name}:{k}")
        finally:
            await log.close()

    try:
        asyncio.run(run())
    except BaseException as exc:  # reported by the test, not lost in a thread
        errors.append(exc)


async def test_many_producers_many_sessions_no_crossing_no_interleaving(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    model = FunctionModel(echo, keep_requests=10_000)  # the test reads every request
    log = SqliteEventLog(path, partitions=PARTITIONS)
    second_round = threading.Event()
    agents = AgentDirectory([Agent("echo", model, [stamp_tool(log, second_round)])])
    api = AgentSessions(log, agents, producer="setup")
    sids = [(await api.create_session("echo", f"user-{i}")).session_id for i in range(SESSIONS)]
    workers = [
        TurnWorker(log, agents, worker_id=f"w{i}", partitions=[p for p in range(PARTITIONS) if p % 2 == i])
        for i in range(2)
    ]
    tasks = [asyncio.create_task(w.run()) for w in workers]

    errors: list[BaseException] = []
    groups = [sids[i::PAIRS] for i in range(PAIRS)]
    threads = [
        threading.Thread(target=produce, args=(path, f"p{g}{side}", group, agents, second_round, errors))
        for g, group in enumerate(groups)
        for side in "ab"
    ]
    for t in threads:
        t.start()
    expected_turns = SESSIONS * 2 * PER_PRODUCER
    deadline = time.monotonic() + WAIT_S
    while await asyncio.to_thread(lambda: [t.join(0.05) for t in threads if t.is_alive()]):
        pass
    assert not errors, errors
    while time.monotonic() < deadline and not await all_consumed(log):
        await asyncio.sleep(0.2)
    for w in workers:
        w.stop()
    await asyncio.gather(*tasks)

    requests_by_session: dict[str, list[ModelRequest]] = defaultdict(list)
    for request in model.requests:
        requests_by_session[request.session_id].append(request)
    assert sum(1 for r in model.requests if len(r.tools) == 1) == expected_turns * 2
    rebased = 0
    for sid in sids:
        events = await log.read_session(sid)
        rebased += check_session(sid, events, requests_by_session[sid])
    print(f"{rebased} worker events were rebased over messages that slipped in")
    assert rebased > 0, "no turn was rebased over a message: the test did not hammer mid-turn"
    await log.close()


async def all_consumed(log: SqliteEventLog) -> bool:
    """The workers have handled every record on the log (their own events included)."""
    for p in range(PARTITIONS):
        if await log.committed(GROUP, p) < await log.end_offset(p):
            return False
    return True


def check_session(sid: str, events: list[ev.Event], requests: list[ModelRequest]) -> int:
    """Assert one session's history is its own and its turns never interleave; return how many
    of its events were rebased over messages that slipped in."""
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert all(e.session_id == sid for e in events)
    received = [e for e in events if isinstance(e, ev.UserMessageReceived)]
    tags = [e.text.removeprefix("msg ") for e in received]
    assert len(tags) == 2 * PER_PRODUCER and all(t.startswith(f"{sid}:") for t in tags), tags

    # turns run one after the other, in log order of their messages, each on its own message
    by_id = {e.message_id: e.text.removeprefix("msg ") for e in received}
    current: str | None = None
    answered: list[str] = []
    for e in events:
        if isinstance(e, ev.TurnStarted):
            assert current is None, f"{sid}: a turn started inside another"
            current = by_id[e.message_id]
        elif isinstance(e, ev.TurnFinished):
            assert current is not None and e.reason == "answered"
            answered.append(current)
            current = None
        elif isinstance(e, ev.ToolCallFinished):
            assert e.content == f"stamped {current}", f"{sid}: a foreign tool result {e.content}"
        elif isinstance(e, ev.AssistantMessage) and e.text:
            assert e.text == f"ack {current} after stamped {current}", f"{sid}: {e.text}"
    assert answered == tags

    # what each model call was sent: this session's messages only, never two new ones at once
    for request in requests:
        users = [m.content.removeprefix("msg ") for m in request.messages if m.role == "user"]
        assert users == tags[: len(users)], f"{sid}: context {users} is not a prefix of {tags}"
        tools = [m.content for m in request.messages if m.role == "tool"]
        assert all(t.startswith(f"stamped {sid}:") for t in tools)
    assert len(requests) == 2 * len(tags)
    # a worker event decided before a producer's message but appended after it was rebased
    arrivals = [e.version for e in received]
    return sum(
        1
        for e in events
        if e.producer.startswith("w") and any(e.basis_version < v < e.version for v in arrivals)
    )
