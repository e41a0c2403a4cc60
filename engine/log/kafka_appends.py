"""Group commit on a Kafka partition: appends that arrive while the owner's transaction is in
flight wait in the partition's queue and go together into its next transaction.

Each append in a group is still checked on its own against its session's expected version
(and against submissions the session already holds), in arrival order, with the versions the
appends before it in the group leave: a conflicting append fails alone (``ConcurrencyError``)
and the others commit. A transaction that fails fails every append it carried, each with its
own error (the outcome is unknown: the owner re-reads the partition, the writers refold).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..errors import ConcurrencyError, DuplicateSubmissionError, LogError
from ..events import Event
from .base import LogRecord
from .kafka_index import PartitionIndex


@dataclass(eq=False)
class PendingAppend:
    """One caller's batch: one session's next events, with the version it expects."""

    session_id: str
    events: list[Event]
    expected_version: int
    done: asyncio.Future[list[LogRecord]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def take_group(part: PartitionIndex, queued: list[PendingAppend]) -> list[PendingAppend]:
    """Of the ``queued`` appends, those whose callers still wait, each checked against the index
    and the appends before it (the ones that conflict fail): the ones to commit, in order."""
    versions: dict[str, int] = {}
    group: list[PendingAppend] = []
    for append in queued:
        if append.done.done():
            continue  # its caller was cancelled before the transaction began
        error = _conflict(part, append, versions)
        if error is not None:
            append.done.set_exception(error)
            continue
        versions[append.session_id] = append.expected_version + len(append.events)
        group.append(append)
    return group


def _conflict(part: PartitionIndex, append: PendingAppend, versions: dict[str, int]) -> LogError | None:
    sid = append.session_id
    for event in append.events:
        if (held := part.held_submission(event)) is not None:
            return DuplicateSubmissionError(sid, *held)
    actual = versions.get(sid, part.version(sid))
    if actual != append.expected_version:
        return ConcurrencyError(sid, append.expected_version, actual)
    return None


def settle_group(part: PartitionIndex, group: list[PendingAppend], records: list[LogRecord]) -> None:
    """Hand each append its records once the group's transaction committed. An append whose
    versions another producer's valid records took first (a foreign write the index folded
    before ours) is refused: its records are poison to every reader."""
    start = 0
    for append in group:
        mine = records[start : start + len(append.events)]
        start += len(append.events)
        indexed = part.session_records_after(append.session_id, append.expected_version)[: len(mine)]
        if [r.offset for r in indexed] == [r.offset for r in mine]:
            _resolve(append, records=mine)
        else:
            actual = part.version(append.session_id)
            _resolve(append, error=ConcurrencyError(append.session_id, append.expected_version, actual))


def fail_group(group: list[PendingAppend], error: LogError) -> None:
    """The group's transaction failed: every append in it gets the error."""
    for append in group:
        _resolve(append, error=error)


def _resolve(
    append: PendingAppend, *, records: list[LogRecord] | None = None, error: Exception | None = None
) -> None:
    if append.done.done():
        return  # the caller stopped waiting (cancelled); the outcome is on the log all the same
    if error is not None:
        append.done.set_exception(error)
    else:
        append.done.set_result(records or [])
