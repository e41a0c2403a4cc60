"""A process's reads ask for partition ends together (engine/log/kafka_ends.py): one request for
the callers that asked meanwhile, and never one sent before a caller asked (it would miss what
was committed just before the call). Against a broker of the test's own making: each request is
answered when the test says, with the ends as they are when it was sent."""

from __future__ import annotations

import asyncio

import pytest

from turnlog.engine.errors import LogUnavailableError
from turnlog.engine.log.kafka_ends import SharedEnds


class Broker:
    """Partition ends that the test moves on; each request is held until ``answer``."""

    def __init__(self) -> None:
        self.ends = {0: 10, 1: 20, 2: 30}
        self.requests: list[frozenset[int]] = []
        self._held: list[asyncio.Future[None]] = []
        self.failing: Exception | None = None

    async def ask(self, partitions: frozenset[int]) -> dict[int, int]:
        self.requests.append(partitions)
        sent = {p: self.ends[p] for p in partitions}  # as the broker has them when it gets it
        held = asyncio.get_running_loop().create_future()
        self._held.append(held)
        await held
        if self.failing is not None:
            raise self.failing
        return sent

    async def sent(self, count: int) -> None:
        """Until ``count`` requests were sent."""
        while len(self.requests) < count:
            await asyncio.sleep(0)

    async def answer(self) -> None:
        """Let the oldest request held come back, once it was sent."""
        while not self._held:
            await asyncio.sleep(0)
        self._held.pop(0).set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)


async def test_callers_at_once_share_one_request_for_every_partition_they_name() -> None:
    broker = Broker()
    ends = SharedEnds(broker.ask)
    calls = [asyncio.ensure_future(ends.end(p)) for p in (0, 1, 1, 2)]
    await broker.answer()
    assert [await c for c in calls] == [10, 20, 20, 30]
    assert broker.requests == [frozenset({0, 1, 2})]


async def test_a_caller_after_a_request_was_sent_waits_for_the_next() -> None:
    broker = Broker()
    ends = SharedEnds(broker.ask)
    first = asyncio.ensure_future(ends.end(0))
    await broker.sent(1)
    broker.ends[0] = 11  # a commit lands, then a second reader asks
    second = asyncio.ensure_future(ends.end(0))
    third = asyncio.ensure_future(ends.end(2))
    await broker.answer()
    assert await first == 10 and not second.done()  # the request in flight was sent before it asked
    await broker.answer()
    assert (await second, await third) == (11, 30)
    assert broker.requests == [frozenset({0}), frozenset({0, 2})]


async def test_a_failed_request_fails_its_callers_and_the_next_call_asks_again() -> None:
    broker = Broker()
    ends = SharedEnds(broker.ask)
    broker.failing = LogUnavailableError("the broker does not answer")
    calls = [asyncio.ensure_future(ends.end(p)) for p in (0, 1)]
    await broker.answer()
    for call in calls:
        with pytest.raises(LogUnavailableError, match="does not answer"):
            await call
    broker.failing = None
    again = asyncio.ensure_future(ends.end(1))
    await broker.answer()
    assert await again == 20 and len(broker.requests) == 2


async def test_a_caller_cancelled_while_waiting_leaves_the_others_their_answer() -> None:
    broker = Broker()
    ends = SharedEnds(broker.ask)
    gone, staying = asyncio.ensure_future(ends.end(0)), asyncio.ensure_future(ends.end(1))
    await broker.sent(1)
    gone.cancel()
    await broker.answer()
    assert await staying == 20 and gone.cancelled()
