"""Appends of many sessions made at the same time: each is still checked against its own
session's version, so a conflicting one fails alone and the others commit. On Kafka they share
transactions (group commit): one commit marker per transaction, not one per append. Both
backends."""

from __future__ import annotations

import asyncio

import pytest

from turnlog.engine import EventLog
from turnlog.engine import events as ev
from turnlog.engine.errors import ConcurrencyError
from turnlog.engine.log.kafka import KafkaEventLog

SESSIONS = 64


def turn_started(sid: str, version: int) -> ev.TurnStarted:
    return ev.TurnStarted(session_id=sid, version=version, turn_id=f"t-{sid}", message_id="m")


async def test_concurrent_appends_commit_together_and_a_conflicting_one_fails_alone(log: EventLog) -> None:
    sids = [f"g-{i:02d}" for i in range(SESSIONS)]
    for sid in sids:
        await log.submit(ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u"))
        await log.submit(ev.UserMessageReceived(session_id=sid, version=0, message_id="m", text="hi"))
    stale = sids[7]
    appends = [
        log.append([turn_started(sid, 3)], expected_version=2)
        if sid != stale
        else log.append([turn_started(sid, 2)], expected_version=1)  # it missed the message
        for sid in sids
    ]
    results = await asyncio.gather(*appends, return_exceptions=True)

    failed = [sid for sid, result in zip(sids, results, strict=True) if isinstance(result, Exception)]
    assert failed == [stale]
    error = results[sids.index(stale)]
    assert isinstance(error, ConcurrencyError) and (error.expected, error.actual) == (1, 2)
    for sid in sids:
        types = [e.type for e in await log.read_session(sid)]
        assert types == ["SessionCreated", "UserMessageReceived"] + (["TurnStarted"] if sid != stale else [])
    if isinstance(log, KafkaEventLog):
        await _shared_transactions(log, results)


async def _shared_transactions(log: KafkaEventLog, results: list[object]) -> None:
    """Within a partition, appends committed in one transaction sit at consecutive offsets; each
    transaction ends with a commit marker that takes an offset of its own."""
    by_partition: dict[int, list[int]] = {}
    for result in results:
        if isinstance(result, list):
            (record,) = result
            by_partition.setdefault(record.partition, []).append(record.offset)
    appends = sum(len(offsets) for offsets in by_partition.values())
    transactions = sum(_runs(sorted(offsets)) for offsets in by_partition.values())
    assert transactions < appends, f"{appends} appends took {transactions} transactions"


def _runs(offsets: list[int]) -> int:
    return 1 + sum(1 for a, b in zip(offsets, offsets[1:], strict=False) if b != a + 1)


@pytest.mark.parametrize("backend", ["kafka"], indirect=True)
async def test_a_closing_log_fails_queued_appends_instead_of_hanging(log: EventLog) -> None:
    assert isinstance(log, KafkaEventLog)
    await log.submit(ev.SessionCreated(session_id="c-1", version=1, agent_id="a", user_id="u"))
    pending = asyncio.gather(
        *(log.append([turn_started("c-1", 2)], expected_version=1) for _ in range(3)), return_exceptions=True
    )
    await asyncio.sleep(0)  # queued behind the first transaction
    await log.close()
    outcomes = await asyncio.wait_for(pending, 60)
    assert all(isinstance(o, list | Exception) for o in outcomes)  # every caller got an answer
    assert sum(isinstance(o, list) for o in outcomes) <= 1  # one version, at most one winner
