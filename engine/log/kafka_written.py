"""The values an owner wrote to its partitions last, kept for its live publisher
(``kafka_live``): an event it committed goes out on the live topic as the very bytes the events
topic holds, encoded and sealed once, and a process that heard it there recognises the record
when its reader of the partition reaches it (the same bytes at the same offset) and does not
decode it again (``kafka_heard``).

Each value is taken once, by the publisher; what it never asks for (a process that publishes
nothing, an item the live queue dropped) goes first once the budget is spent. Nothing is kept
before a publisher has asked once.
"""

from __future__ import annotations

from collections import OrderedDict

from .base import LogRecord

BUDGET_BYTES = 4 << 20
"""What the values kept may weigh: the oldest go first past it."""


class WrittenValues:
    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.weight = 0
        self.wanted = False
        """A publisher has asked for a value: from then on committed values are kept."""
        self._values: OrderedDict[tuple[int, int], bytes] = OrderedDict()

    def add(self, records: list[LogRecord], values: list[bytes]) -> None:
        """``records`` were committed with ``values`` as their events-topic values."""
        if not self.wanted:
            return
        for record, value in zip(records, values, strict=True):
            self._values[(record.partition, record.offset)] = value
            self.weight += len(value)
        while self.weight > self.budget_bytes and self._values:
            _, oldest = self._values.popitem(last=False)
            self.weight -= len(oldest)

    def take(self, record: LogRecord) -> bytes | None:
        """The value ``record`` was written with, if still kept (it is kept no longer)."""
        self.wanted = True
        value = self._values.pop((record.partition, record.offset), None)
        if value is not None:
            self.weight -= len(value)
        return value
