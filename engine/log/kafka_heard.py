"""Committed records a process heard of on the live topic before its reader of the partition has
them (engine.log.kafka_live): the owner that committed them names each event's offset, so a read
that knows a version is committed (``read_session_records_through``, an SSE stream woken by the
notice) answers from them instead of fetching the partition through the transaction's markers.

They are what the partition holds: the owner's committed records, decoded by this process's
codec. Only a contiguous run of versions is served (a gap goes to the partition), a session's
are dropped once its index holds them, and a session found erased drops them (its content was
decoded before the erasure). Bounded by sessions; nothing here is a source of truth.
"""

from __future__ import annotations

from collections import OrderedDict

from .base import LogRecord

SESSIONS = 2048
"""Sessions whose heard records are kept; the least recently heard goes first."""


class HeardRecords:
    def __init__(self, sessions: int = SESSIONS) -> None:
        self.sessions = sessions
        self._heard: OrderedDict[str, dict[int, LogRecord]] = OrderedDict()

    def add(self, record: LogRecord) -> None:
        session_id = record.event.session_id
        versions = self._heard.get(session_id)
        if versions is None:
            versions = self._heard[session_id] = {}
            while len(self._heard) > self.sessions:
                self._heard.popitem(last=False)
        else:
            self._heard.move_to_end(session_id)
        versions[record.event.version] = record

    def run(self, session_id: str, after_version: int, version: int) -> list[LogRecord] | None:
        """The records of versions ``after_version + 1`` to ``version``, or None if one is missing."""
        versions = self._heard.get(session_id)
        if not versions:
            return None
        run: list[LogRecord] = []
        for v in range(after_version + 1, version + 1):
            if (record := versions.get(v)) is None:
                return None
            run.append(record)
        return run

    def drop_through(self, session_id: str, version: int) -> None:
        """The partition's reader holds the session through ``version``: forget those."""
        versions = self._heard.get(session_id)
        if versions:
            for v in [v for v in versions if v <= version]:
                del versions[v]

    def forget(self, session_id: str) -> None:
        """The session is erased (a codec's ``on_forget`` listener: only notes it)."""
        self._heard.pop(session_id, None)
