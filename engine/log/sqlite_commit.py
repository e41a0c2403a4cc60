"""Group commit for the embedded log's power-loss durability (``durability="power"``).

With ``synchronous=FULL`` every COMMIT of a WAL database is an fsync. Committing each append in a
transaction of its own costs one fsync per append, on the event-loop thread, so 200 sessions
stepping at once wait for 200 fsyncs in a row. ``GroupCommit`` shares one transaction, and so one
fsync, among every append made while the previous transaction was being committed:

* an append's writes run on the event-loop thread, inside the open transaction, in a savepoint of
  their own: an append that fails (a lost version race, a held submission, any error) rolls back
  alone and fails at once; the others of its batch go on;
* the COMMIT runs on a thread of its own, so the loop keeps working during the fsync and the
  appends made meanwhile queue for the next transaction;
* an append returns only after its batch's COMMIT returned: its events are then on disk. If the
  COMMIT fails, every append of the batch fails (``LogUnavailableError``) and none is on the log.

The writes go through a connection of their own: readers on the log's connection never see a
batch before it is committed. Per-session order needs nothing more: each session has one writer
at a time (the version check), and a session's appends are checked in arrival order inside a
transaction that sees everything committed and batched before them.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from ..errors import LogUnavailableError

T = TypeVar("T")
Connect = Callable[[], sqlite3.Connection]


class GroupCommit:
    """One writer connection whose transactions carry the appends of many sessions."""

    def __init__(self, connect: Connect, *, off_loop: bool = True) -> None:
        self._connect = connect
        self._off_loop = off_loop
        """COMMIT on a thread of its own (an fsync), or on the loop (no fsync: cheaper inline)."""
        self._db: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._open = False
        """A transaction is open and takes writes; it is committed on the loop's next turn."""
        self._committing = False
        self._members: list[asyncio.Future[None]] = []
        """The open transaction's writes, each waiting for its COMMIT."""
        self._waiting: list[asyncio.Future[None]] = []
        """Writes (and ``close``) waiting for the COMMIT in flight to end."""
        self.writes = 0
        """Writes committed (each an append, or an offset commit)."""
        self.commits = 0
        """Transactions committed: with ``synchronous=FULL``, one fsync each."""

    async def write(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` in the next transaction; return its result once that is committed.

        ``job`` runs on the caller's thread, in a savepoint: if it raises, its writes are rolled
        back and the error propagates at once. A caller cancelled while it waits for the
        COMMIT does not withdraw its writes (they are committed or failed with the batch)."""
        loop = asyncio.get_running_loop()
        while self._committing:
            await self._wait(loop)
        db = self._connection()
        if not self._open:
            db.execute("BEGIN IMMEDIATE")
            self._open = True
            loop.call_soon(self._flush, loop)  # after every write the loop has ready to run
        db.execute("SAVEPOINT append")
        try:
            result = job(db)
        except BaseException:
            db.execute("ROLLBACK TO append")
            db.execute("RELEASE append")
            raise
        db.execute("RELEASE append")
        done: asyncio.Future[None] = loop.create_future()
        self._members.append(done)
        await done
        return result

    async def close(self) -> None:
        """Wait for the open transaction and the COMMIT in flight, then close the connection."""
        loop = asyncio.get_running_loop()
        while self._open or self._committing:
            await self._wait(loop)
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        if self._db is not None:
            self._db.close()
            self._db = None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = self._connect()
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="turnlog-sqlite-commit")
        return self._db

    def _wait(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = loop.create_future()
        self._waiting.append(fut)
        return fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        members, self._members = self._members, []
        self._open = False
        self._committing = True
        assert self._db is not None and self._thread is not None
        if self._off_loop:
            commit = loop.run_in_executor(self._thread, _commit, self._db)
        else:
            commit = loop.create_future()
            try:
                _commit(self._db)
                commit.set_result(None)
            except Exception as exc:
                commit.set_exception(exc)
        commit.add_done_callback(lambda f: self._committed(f, members))

    def _committed(self, commit: asyncio.Future[None], members: list[asyncio.Future[None]]) -> None:
        self._committing = False
        error = commit.exception()
        if error is None:
            self.commits += 1
            self.writes += len(members)
        for member in members:
            if member.done():  # its caller was cancelled
                continue
            if error is None:
                member.set_result(None)
            else:
                member.set_exception(
                    LogUnavailableError(
                        f"the embedded log could not commit a batch of {len(members)} appends "
                        f"({type(error).__name__}: {error}); none of them is on the log. Check the "
                        "disk the log file is on (space, permissions) and retry."
                    )
                )
        waiting, self._waiting = self._waiting, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)


def _commit(db: sqlite3.Connection) -> None:
    """COMMIT (the fsync); on failure roll back, so the connection takes the next batch."""
    try:
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
