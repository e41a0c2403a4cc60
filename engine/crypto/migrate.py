"""Copy a log into a new one event for event, each session's versions and order kept: how a log
written before encryption gets its content encrypted (``turnlog migrate-encrypt``). The new log
encrypts what it is given; the old one is read through its own cipher (a log written partly
after encryption opens those values) and then must be deleted by the operator: until it is, it
holds the plaintext (and so does every copy or backup of it)."""

from __future__ import annotations

from typing import Callable

from ..events import Event
from ..log.base import EventLog
from .cipher import ContentCipher

BATCH = 500


async def copy_log(source: EventLog, dest: EventLog, on_events: Callable[[int], None] | None = None) -> int:
    """Every event of ``source`` appended to ``dest`` (empty, the same partition count), in
    ``source``'s order per partition; consecutive events of a session go in one append. Returns
    how many."""
    copied = 0
    for partition in range(source.partitions):
        offset = 0
        while records := await source.read_partition(partition, offset, BATCH):
            run: list[Event] = []
            for record in records:
                if run and record.event.session_id != run[0].session_id:
                    await dest.append(run, expected_version=run[0].version - 1)
                    run = []
                run.append(record.event)
            if run:
                await dest.append(run, expected_version=run[0].version - 1)
            copied += len(records)
            offset = records[-1].offset + 1
            if on_events is not None:
                on_events(len(records))
    return copied


def copy_erasures(source: ContentCipher, dest: ContentCipher, now_ms: int) -> int:
    """Mark erased in ``dest``'s key store the sessions ``source``'s had erased (their content was
    copied as erased; no key of theirs should be used again)."""
    erased = source.keys.erased_since(0)[1]
    if erased:
        dest.keys.destroy(erased, "copied", now_ms)
    return len(erased)
