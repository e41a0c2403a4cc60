"""Group commit for the embedded log: the appends of every session made while one transaction
was committing share the next one, and so, with ``durability="power"``, one fsync.

Each append runs its job in that transaction on a writer connection of its own, in a savepoint
(one that fails rolls back and fails alone), and returns once the COMMIT has returned; a COMMIT
that fails fails every append it carried. The COMMIT runs on the event loop while fsyncs are
fast and on a thread of its own once they are slow (``INLINE_BELOW_S``), so a slow disk does not
stop the loop; a write with nothing to wait for commits at once (``RUN_NOW_IN_A_ROW``). A
*redoable* write (``on_lost``) returns before its COMMIT, and a transaction of only such writes
is held open up to ``HOLD_S`` for the next write that waits, so a turn's steps share the COMMIT
that ends it; a read in this process first commits what is held (``caught_up``).
docs/architecture.md ("Group commit on SQLite") has every rule and its reason.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from ..errors import LogUnavailableError
from .sqlite_held import HeldRows

T = TypeVar("T")
Connect = Callable[[], sqlite3.Connection]
Job = Callable[[sqlite3.Connection], T]
"""One append's (or offset commit's) writes, run inside the shared transaction."""
Lost = Callable[[BaseException], None]
"""Told that the COMMIT of a write that returned before it (a redoable write) failed."""
Batch = list[tuple[Job[Any], asyncio.Future[Any], Lost | None]]
"""The writes of one transaction, each with the future its caller waits on and, for a redoable
write, what to tell if its COMMIT fails."""
Members = list[tuple[asyncio.Future[Any], Any, Lost | None]]
"""The writes of a transaction whose jobs succeeded, each with its result."""

INLINE_BELOW_S = 0.002
"""A COMMIT (an fsync) that takes less than this, on average, runs on the loop: the loop's other
work waits at most about this long, and no thread hop is paid."""
PROBE_EVERY = 16
"""While the COMMITs run off the loop, one in this many runs on it, to measure the disk again."""
RUN_NOW_IN_A_ROW = 16
"""Writes committed at once before one waits for the loop's next turn again, so a task that
only appends still lets the loop poll its sockets. (The count does not see the loop's turns
in between: with writes far apart, one in 17 waits a turn it did not need, which is harmless.)"""
HOLD_S = 0.005
"""How long a transaction of redoable writes only stays open for more writes to join it: the
lag of other processes' readers behind them, and the work a crash can make a writer redo."""
_SMOOTHING = 0.25
"""Weight of the newest COMMIT time in the running average."""


_HOLDING: set[GroupCommit] = set()
"""The group commits holding a transaction open, each with its loop (``GroupCommit._hold_loop``)."""


def commit_every_hold() -> None:
    """Commit the transactions held open by the group commits on this thread's running loop.
    Called before another connection on this thread takes the write lock (a second log on the
    same file opening, or starting a transaction) or reads: it would otherwise wait for the
    write lock, blocking the thread whose loop must run the hold's timer, or miss appends that
    have returned."""
    if not _HOLDING:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop runs here, so none of the holds is this thread's
        return
    for group in list(_HOLDING):
        if group._hold_loop is loop:
            group.commit_held()


class GroupCommit:
    """One writer connection whose transactions carry the appends of many sessions."""

    def __init__(
        self,
        connect: Connect,
        *,
        off_loop: bool = True,
        inline_below_s: float = INLINE_BELOW_S,
        hold_s: float = HOLD_S,
        held_rows: HeldRows | None = None,
    ) -> None:
        """``held_rows``: where the redoable jobs leave their rows (engine.log.sqlite_held);
        written before any other job of the transaction and before its COMMIT."""
        self._connect = connect
        self.held_rows = held_rows
        self._hold_s = hold_s
        self._off_loop = off_loop
        """A slow COMMIT may run on a thread of its own (an fsync); False: always on the loop."""
        self._inline_below_s = inline_below_s
        self._commit_s = 0.0
        """Running average of the COMMITs timed on the loop."""
        self._since_probe = 0
        """COMMITs run off the loop since the last one on it."""
        self._run_now = 0
        """Writes committed at once since the last that waited for the loop's next turn."""
        self._db: sqlite3.Connection | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._queue: Batch = []
        """Writes waiting for the next transaction."""
        self._held: Members = []
        """Redoable writes in the transaction held open (returned, not committed yet)."""
        self._hold_timer: asyncio.TimerHandle | None = None
        self._hold_loop: asyncio.AbstractEventLoop | None = None
        self._redoable_in_flight = False
        """The COMMIT in flight (on the thread) carries writes that have returned already."""
        self._catching_up: list[asyncio.Future[None]] = []
        """Readers waiting for that COMMIT (``caught_up``)."""
        self._scheduled = False
        self._committing = False
        self._idle: list[asyncio.Future[None]] = []
        """``close`` waiting for the queue and the COMMIT in flight."""
        self.writes = 0
        """Writes committed (each an append, or an offset commit)."""
        self.commits = 0
        """Transactions committed: with ``synchronous=FULL``, one fsync each."""
        self.on_settled: Callable[[], None] | None = None
        """Told when a transaction's COMMIT has returned or failed: the writes that had returned
        before it are settled (engine.log.local_live announces them then)."""

    async def write(self, job: Job[T], *, on_lost: Lost | None = None) -> T:
        """Run ``job`` in the next transaction; return its result once that is committed (with
        ``on_lost``, a redoable write: once the job has run; see the module doc).

        The transaction runs on the loop's next turn with every write queued by then (at
        once, inside this call, when nothing could join it before that turn), each
        ``job`` in a savepoint: one that raises has its writes rolled back and its caller gets
        the error at once, while the others commit. The write lock is taken and the jobs run in
        one callback, never across an await, except for a held transaction, which every other
        connection of this module on this thread commits before it takes the lock or reads
        (``commit_every_hold``), so none can wait for a hold whose timer needs this thread. A
        caller cancelled before its transaction ran withdraws its
        write; once it ran, the write is committed or fails with its batch."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if self._nothing_else_to_run(loop):
            self._run_now += 1
            self._transact(loop, [(job, fut, on_lost)])  # what _flush would do on the loop's next turn
        else:
            self._queue.append((job, fut, on_lost))
            self._schedule(loop)
        return await fut  # returns at once if the COMMIT ran on the loop

    async def close(self) -> None:
        """Commit the held writes, wait for the queued ones and the COMMIT in flight, then close
        the connection (writes held while it waited are committed too: their callers returned)."""
        loop = asyncio.get_running_loop()
        self.commit_held()
        while self._busy():
            fut: asyncio.Future[None] = loop.create_future()
            self._idle.append(fut)
            await fut
            self.commit_held()
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        if self._db is not None:
            self._db.close()
            self._db = None

    def behind(self) -> bool:
        """Some write has returned that is not committed yet (held, or in the COMMIT in flight)."""
        return bool(self._held) or self._redoable_in_flight

    async def caught_up(self) -> None:
        """Return once every write that has returned is committed: the held ones are committed
        now. A reader in this process waits for this first, so it reads every such write."""
        self.commit_held()
        loop = asyncio.get_running_loop()
        while self._redoable_in_flight:
            fut: asyncio.Future[None] = loop.create_future()
            self._catching_up.append(fut)
            await fut

    def commit_held(self) -> None:
        """Commit the held transaction now (a no-op if none is held)."""
        members = self._end_hold()
        if members:
            self._commit(members)

    def _hold(self, loop: asyncio.AbstractEventLoop, members: Members) -> None:
        """Keep the transaction open with ``members`` in it, for up to ``hold_s``."""
        self._held.extend(members)
        if self._hold_timer is None:
            self._hold_timer = loop.call_later(self._hold_s, self.commit_held)
            self._hold_loop = loop
            _HOLDING.add(self)

    def _end_hold(self) -> Members:
        """The held writes, no longer held (their transaction is still open: commit it)."""
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        _HOLDING.discard(self)
        members, self._held = self._held, []
        return members

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = self._connect()
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="turnlog-sqlite-commit")
        return self._db

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._queue and not self._scheduled and not self._committing:
            self._scheduled = True
            loop.call_soon(self._flush, loop)  # after every write the loop has ready to run
        elif not self._busy():
            idle, self._idle = self._idle, []
            for fut in idle:
                if not fut.done():
                    fut.set_result(None)

    def _busy(self) -> bool:
        """Writes are queued, a flush is scheduled, or a COMMIT is in flight."""
        return bool(self._queue) or self._scheduled or self._committing

    def _nothing_else_to_run(self, loop: asyncio.AbstractEventLoop) -> bool:
        """No write is waiting or committing and the loop has no other callback ready: no
        other write can join this one before ``_flush`` would run, so the transaction can run
        now and save the caller two turns of the loop (the flush's, and its own wake-up). The
        ready queue is asyncio's own (``_ready``); a loop without one always defers."""
        if self._busy() or self._run_now >= RUN_NOW_IN_A_ROW:
            return False
        ready = getattr(loop, "_ready", None)
        return isinstance(ready, deque) and not ready

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = False
        if self._committing:  # the hold's COMMIT left the loop after this flush was scheduled
            return  # (its timer, or a read, committed it): ``_committed`` schedules it again
        self._run_now = 0
        batch = [write for write in self._queue if not write[1].done()]
        self._queue = []
        if batch:
            self._transact(loop, batch)
        else:
            self._schedule(loop)

    def _transact(self, loop: asyncio.AbstractEventLoop, batch: Batch) -> None:
        """Run ``batch`` in the held transaction or a new one, then commit it (on the loop or
        on the thread), or hold it when every write in it is redoable."""
        db = self._connection()
        held = self._held
        if not held:
            commit_every_hold()  # another log's, on this file maybe: it must not hold the lock we wait for
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:  # the file is locked by another process for too long
                for _, fut, _ in batch:
                    fut.set_exception(exc)
                self._schedule(loop)
                return
        members = self._run(db, batch, isolate=bool(held))
        if not members:  # every job failed: nothing new to commit
            if not held:
                db.execute("ROLLBACK")
            self._schedule(loop)
            return
        if not _settle_redoable(members):  # nobody waits for this COMMIT: hold it for more
            self._hold(loop, members)
            self._schedule(loop)
            return
        self._commit(self._end_hold() + members)

    def _commit(self, members: Members) -> None:
        """Write the held rows, then COMMIT the open transaction of ``members``: on the thread
        if COMMITs have been slow, else here. Rows that cannot be written fail the transaction
        like a failed COMMIT."""
        loop = asyncio.get_running_loop()
        db = self._connection()
        self._committing = True
        if self.held_rows:
            try:
                self.held_rows.flush(db)
            except Exception as exc:
                self.held_rows.drop()
                if db.in_transaction:
                    db.execute("ROLLBACK")
                self._committed(exc, members, loop)
                return
        if self._commit_off_loop():
            assert self._thread is not None
            self._redoable_in_flight = any(lost is not None for _, _, lost in members)
            commit = loop.run_in_executor(self._thread, _commit, db)
            commit.add_done_callback(lambda f: self._committed(f.exception(), members, loop))
            return
        started = time.perf_counter()
        try:
            _commit(db)
        except Exception as exc:
            self._committed(exc, members, loop)
        else:
            self._commit_s += (time.perf_counter() - started - self._commit_s) * _SMOOTHING
            self._committed(None, members, loop)

    def _commit_off_loop(self) -> bool:
        """Whether this batch's COMMIT goes to the thread: the COMMITs timed on the loop have
        been slow, and this is not the one in ``PROBE_EVERY`` that measures them again."""
        if not self._off_loop or self._commit_s < self._inline_below_s:
            return False
        self._since_probe += 1
        if self._since_probe >= PROBE_EVERY:
            self._since_probe = 0
            return False
        return True

    def _run(self, db: sqlite3.Connection, batch: Batch, *, isolate: bool) -> Members:
        """Run the jobs; the ones that succeeded, with their results. A job of a batch of
        several, or joining held writes (``isolate``), runs in a savepoint, so one that fails
        rolls back alone; a job alone needs none (if it fails, the whole transaction is rolled
        back: two statements fewer per append). A redoable job needs none either: it writes
        nothing it would have to undo (its row waits in ``held_rows``), and the held rows are
        written before any other job runs, outside that job's savepoint."""
        if len(batch) == 1 and not isolate:
            job, fut, on_lost = batch[0]
            try:
                return [(fut, job(db), on_lost)]
            except Exception as exc:
                fut.set_exception(exc)
                return []
        members: Members = []
        for job, fut, on_lost in batch:
            if on_lost is not None:
                try:
                    members.append((fut, job(db), on_lost))
                except Exception as exc:
                    fut.set_exception(exc)
                continue
            if not self._held_rows_written(db, fut):
                continue
            db.execute("SAVEPOINT append")
            try:
                result = job(db)
            except Exception as exc:
                fut.set_exception(exc)
                db.execute("ROLLBACK TO append")
            else:
                members.append((fut, result, on_lost))
            db.execute("RELEASE append")
        return members

    def _held_rows_written(self, db: sqlite3.Connection, fut: asyncio.Future[Any]) -> bool:
        """Write the held rows before a job that reads or writes the file; if they cannot be,
        fail that job (the rows stay held: the COMMIT tries them again, and if it fails their
        writers are told)."""
        if not self.held_rows:
            return True
        try:
            self.held_rows.flush(db)
        except Exception as exc:
            fut.set_exception(
                LogUnavailableError(
                    f"the embedded log could not write the appends held before this one "
                    f"({type(exc).__name__}: {exc}); this one is not on the log. Check the disk the "
                    "log file is on (space, permissions) and retry."
                )
            )
            return False
        return True

    def _committed(
        self, error: BaseException | None, members: Members, loop: asyncio.AbstractEventLoop
    ) -> None:
        """The batch's COMMIT returned (``error`` None) or failed: settle its appends (tell the
        redoable ones, which returned already, that theirs failed)."""
        self._committing = False
        self._redoable_in_flight = False
        catching_up, self._catching_up = self._catching_up, []
        for waiting in catching_up:
            if not waiting.done():
                waiting.set_result(None)
        if error is None:
            self.commits += 1
            self.writes += len(members)
        for fut, result, on_lost in members:
            if on_lost is not None:
                if error is not None:
                    on_lost(error)
                continue
            if fut.done():  # its caller was cancelled
                continue
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(
                    LogUnavailableError(
                        f"the embedded log could not commit a batch of {len(members)} appends "
                        f"({type(error).__name__}: {error}); none of them is on the log. Check the "
                        "disk the log file is on (space, permissions) and retry."
                    )
                )
        if self.on_settled is not None:
            self.on_settled()
        self._schedule(loop)


def _settle_redoable(members: Members) -> bool:
    """Settle the redoable writes now, before their COMMIT; whether any other write waits."""
    waiting = False
    for fut, result, on_lost in members:
        if on_lost is None:
            waiting = True
        elif not fut.done():
            fut.set_result(result)
    return waiting


def _commit(db: sqlite3.Connection) -> None:
    """COMMIT (the fsync); on failure roll back, so the connection takes the next batch."""
    try:
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
