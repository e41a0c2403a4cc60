"""``EventLog.read_session_records``: a session's events with their log positions. The SQLite
backend answers from its index, the Kafka one from its partition index; the base class's
default (a partition scan, what a backend without an index inherits) must give the same
records."""

from __future__ import annotations

from turnlog.engine import Agent, AgentDirectory, AgentSessions, EventLog, FunctionModel, SqliteEventLog


async def test_default_and_indexed_session_records_agree(log: SqliteEventLog) -> None:
    api = AgentSessions(log, AgentDirectory([Agent.build("a", FunctionModel(lambda request: "ok"))]))
    sids = [(await api.create_session("a", f"u{i}")).session_id for i in range(6)]
    for sid in sids * 2:  # sessions interleave on their partitions
        async for _ in api.send_user_message(sid, "hi"):
            pass
    for sid in sids:
        indexed = await log.read_session_records(sid)
        assert [r.event.version for r in indexed] == list(range(1, len(indexed) + 1))
        assert {r.partition for r in indexed} == {log.partition_of(sid)}
        assert await EventLog.read_session_records(log, sid) == indexed
        assert (
            await EventLog.read_session_records(log, sid, 3)
            == indexed[3:]
            == await log.read_session_records(sid, 3)
        )
        offsets = [r.offset for r in indexed]
        assert offsets == sorted(offsets)
