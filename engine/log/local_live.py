"""Live items across the processes on one machine that share an embedded log file: the
embedded counterpart of Kafka's live topic (``kafka_live``), for `turnlog serve --no-worker`
beside a `turnlog worker`.

Every process that opens the channel listens on a Unix domain socket in a directory beside the
log file (``<log file>.live/``; under the temporary directory when that path is too long for a
socket address) and connects to every other socket there. A newcomer connects to the processes
already there and says hello; each of them connects back, so every pair ends with one connection
each way and nobody scans the directory again. A socket file whose process is gone refuses the
connection and is removed. A line of JSON per message:

* ``append``: the log in that process appended a session's events up to ``version``. Sent once
  the append is committed (a held append, engine.log.sqlite_commit, waits for its COMMIT), so
  a reader woken by it reads what it announces. A listener's waits for appends wake at once
  (``on_append``) and its event streams hear a ``Committed`` notice;
* ``delta``: a token delta a turn worker streamed. Deltas queue behind an announcement that
  waits for its COMMIT, so they never overtake the events they follow;
* ``waiting``: a model call of a turn worker waiting for its endpoint's client-side limits (and
  the end of that wait), queued like a delta.

Nothing here is a source of truth: a peer that is missing, gone, or too slow (its unsent bytes
past ``MAX_BUFFER``) loses live items, never events (streams read the log, and poll it), and
sending never blocks or fails an append. Anyone who may open the socket directory may also
write the log file beside it: the channel trusts them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import structlog

from ..stream import Committed, LiveItem, ModelDelta, ModelWaiting, StreamItem

log = structlog.get_logger("turnlog.live")
MAX_SOCKET_PATH = 100
"""Longest socket path used beside the log file (the system's limit is 107 bytes on Linux)."""
MAX_BUFFER = 1 << 20
"""Bytes waiting to go to one peer; past it, that peer's new items are dropped (it is stuck)."""
MAX_LINE = 1 << 20
CONNECT_BACK_S = 2.0
"""How long ``start`` waits for the processes already there to connect back."""
QUEUE_SIZE = 10_000
"""Items heard and not yet taken by ``items()``; past it new ones are dropped."""


def socket_dir(log_path: Path) -> Path:
    """Where the processes sharing ``log_path`` put their sockets."""
    beside = Path(f"{log_path}.live")
    if len(str(beside)) + 40 <= MAX_SOCKET_PATH:
        return beside
    digest = hashlib.sha256(str(log_path.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"turnlog-live-{os.getuid()}" / digest


class LocalLive:
    """This process's end of the channel: ``appended`` and ``publish`` send, ``items`` and
    ``on_append`` hear."""

    def __init__(self, log_path: Path, *, role: str, on_append: Callable[[], None] | None = None) -> None:
        self.dir = socket_dir(log_path)
        self.name = f"{role}-{os.getpid()}-{secrets.token_hex(3)}.sock"
        self.on_append = on_append
        self._server: asyncio.AbstractServer | None = None
        self._peers: dict[str, asyncio.StreamWriter] = {}
        self._held: list[bytes] = []
        """Messages waiting for the log's COMMIT of an append announced before them."""
        self._queue: asyncio.Queue[LiveItem] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._incoming: set[asyncio.StreamWriter] = set()
        self._hellos: set[str] = set()
        """The peers that have connected to us (said hello)."""
        self._hello = asyncio.Event()
        self.dropped = 0

    async def start(self) -> None:
        """Listen, and connect to every process already on the channel. Where that cannot be
        (no Unix sockets here, a directory we may not write) the process runs without it: the
        others see its appends on their next poll."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._server = await asyncio.start_unix_server(
                self._accepted, path=self.dir / self.name, limit=MAX_LINE
            )
        except (OSError, NotImplementedError, AttributeError) as exc:
            log.warning("live.unavailable", directory=str(self.dir), error=repr(exc))
            return
        for path in sorted(self.dir.glob("*.sock")):
            await self._connect(path.name)
        await self._connected_back(set(self._peers))

    async def _connected_back(self, names: set[str]) -> None:
        """Wait until each of ``names`` has connected to us in turn (they do on our hello), so
        what they append from now on reaches us; a peer slower than ``CONNECT_BACK_S`` joins
        when it gets to it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_BACK_S
        while not names <= self._hellos and (left := deadline - loop.time()) > 0:
            self._hello.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hello.wait(), left)

    # -- sending ----------------------------------------------------------------------------------

    def appended(self, session_id: str, version: int, event_type: str, *, committed: bool) -> None:
        """The log appended ``session_id`` up to ``version``; not ``committed`` yet: announce it
        at ``release``. With no peer there is no one to tell (one that joins later polls the log
        once), and nothing is encoded."""
        if not self._peers:
            return
        message = {"k": "append", "s": session_id, "v": version, "t": event_type}
        self._send(_line(message), hold=not committed)

    def publish(self, item: StreamItem) -> None:
        """A turn worker's stream item (its ``on_item``): deltas and waits go out; events are
        announced by the log itself when committed, progress notes stay local."""
        if not self._peers:
            return
        if isinstance(item, ModelDelta):
            message = {"k": "delta", "s": item.session_id, "u": item.turn_id, "n": item.step, "x": item.text}
            self._send(_line(message))
        elif isinstance(item, ModelWaiting):
            message = {"k": "waiting", "s": item.session_id, "u": item.turn_id, "n": item.step}
            message.update(m=item.model, r=item.reason, a=item.ahead, w=item.waiting)
            self._send(_line(message))

    def release(self) -> None:
        """The log committed what it had appended: send what waited for that."""
        held, self._held = self._held, []
        for line in held:
            self._write(line)

    def _send(self, line: bytes, *, hold: bool = False) -> None:
        if hold or self._held:
            self._held.append(line)
        else:
            self._write(line)

    def _write(self, line: bytes) -> None:
        for name, writer in list(self._peers.items()):
            if writer.is_closing():
                self._peers.pop(name, None)
            elif writer.transport.get_write_buffer_size() > MAX_BUFFER:
                self.dropped += 1
            else:
                writer.write(line)

    # -- connections ------------------------------------------------------------------------------

    async def _connect(self, name: str) -> None:
        """A connection to the process listening on ``name`` (once), with a hello naming us."""
        if name == self.name or name in self._peers:
            return
        path = self.dir / name
        try:
            reader, writer = await asyncio.open_unix_connection(path)
        except ConnectionRefusedError:  # nobody listens: its process is gone (or it is no socket)
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()
            return
        except OSError:  # removed meanwhile, or not a socket
            return
        if name in self._peers:  # connected meanwhile (its hello came in while we waited)
            writer.close()
            return
        self._peers[name] = writer
        writer.write(_line({"k": "hello", "n": self.name}))
        self._spawn(self._until_closed(name, reader, writer))

    async def _until_closed(
        self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Forget the peer when its end closes (nothing is ever read on this connection)."""
        with contextlib.suppress(OSError):
            await reader.read()
        if self._peers.get(name) is writer:
            del self._peers[name]
        writer.close()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A peer's connection: its messages, one a line, until it closes."""
        self._incoming.add(writer)
        try:
            while line := await reader.readline():
                self._heard(line)
        except (OSError, ValueError) as exc:  # a line over MAX_LINE, a reset
            log.warning("live.peer_dropped", error=repr(exc))
        finally:
            self._incoming.discard(writer)
            writer.close()

    def _heard(self, line: bytes) -> None:
        try:
            message = json.loads(line)
            kind = message["k"]
            if kind == "hello":
                name = str(message["n"])
                self._hellos.add(name)
                self._hello.set()
                self._spawn(self._connect(name))
            elif kind == "append":
                if self.on_append is not None:
                    self.on_append()
                self._deliver(Committed(str(message["s"]), int(message["v"]), str(message["t"])))
            elif kind == "delta":
                self._deliver(
                    ModelDelta(str(message["s"]), str(message["u"]), int(message["n"]), str(message["x"]))
                )
            elif kind == "waiting":
                self._deliver(_waiting(message))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("live.item_skipped", error=repr(exc))

    # -- hearing ----------------------------------------------------------------------------------

    def _deliver(self, item: LiveItem) -> None:
        if self._queue is None:
            return  # nobody listens for items here (a worker hears only appends)
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1

    async def items(self) -> AsyncIterator[LiveItem]:
        """What the other processes stream (their commit notices and deltas), from now on."""
        if self._queue is None:
            self._queue = asyncio.Queue(QUEUE_SIZE)
        while True:
            yield await self._queue.get()

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop listening, remove our socket, close the connections."""
        self.release()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(OSError):
                (self.dir / self.name).unlink()
        for writer in [*self._peers.values(), *self._incoming]:
            writer.close()
        self._peers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._server = None


def _waiting(message: dict[str, Any]) -> ModelWaiting:
    return ModelWaiting(
        str(message["s"]),
        str(message["u"]),
        int(message["n"]),
        str(message["m"]),
        str(message["r"]),
        int(message["a"]),
        bool(message["w"]),
    )


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode() + b"\n"
