"""The gateway's HTTP server: uvicorn with read timeouts and JSON answers below the application.

uvicorn (0.54, h11) bounds the idle time between requests on a connection (``timeout_keep_alive``,
armed only once an answer has ended) and the size of a request head
(``h11_max_incomplete_event_size``), but nothing bounds how long a client may take to send a
request: half a header or a body shorter than its Content-Length holds a connection open for
ever. ``GuardedH11Protocol`` adds two deadlines per request, set from ``Limits``:

* the request line and headers must be in within ``header_timeout_s`` of the connection opening
  (or of the previous answer ending); past it the connection is closed, with a 408 if part of a
  request had arrived;
* the body must be in within ``body_timeout_s`` of the headers; past it, a 408 (unless the answer
  has started) and the connection is closed, and the application sees a disconnect.

A chunked body whose chunk-size lines announce more than ``max_message_bytes`` in all is answered
413 as soon as such a line is read, not when the body deadline ends (h11 would wait for those
bytes); the rest of that body is read and dropped, not buffered.

A request h11 cannot parse gets uvicorn's 400 in the gateway's ``{"error", "detail"}`` shape
(431 for a head over ``max_header_bytes``), like every other refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
from http import HTTPStatus
from types import FrameType
from typing import Any, Callable, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from turnlog.consumers.health import Readiness

from .bodies import too_large_detail
from .limits import Limits


class _RecordingConnection(h11.Connection):
    """h11's connection, refusing a request head over ``max_head_bytes`` (h11 checks its limit only
    while a head is incomplete, so a large head sent at once passes it), remembering the last
    protocol error for the answer that reports it, and counting the request body received."""

    last_error: h11.RemoteProtocolError | None = None

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.body_bytes = 0
        """Bytes of the current request's body parsed so far."""

    def next_event(self) -> Any:
        try:
            event = super().next_event()
            if isinstance(event, h11.Request):
                if _head_size(event) > self.max_head_bytes:
                    raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
                self.body_bytes = 0
            elif isinstance(event, h11.Data):
                self.body_bytes += len(event.data)
            return event
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise

    def announced_body(self) -> int:
        """The body bytes received plus those the chunk being read has announced and not yet sent
        (h11 keeps that count on its chunked reader; 0 if a later h11 keeps it elsewhere)."""
        if self.their_state is not h11.SEND_BODY:
            return 0
        pending = getattr(getattr(self, "_reader", None), "_bytes_in_chunk", 0)
        return self.body_bytes + (pending if isinstance(pending, int) else 0)


def _head_size(request: h11.Request) -> int:
    """The request line and headers as sent, give or take the spaces h11 trimmed."""
    line = len(request.method) + len(request.target) + 11
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items())


def json_error_bytes(status: int, code: str, detail: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written below h11 (which cannot send
    one before a request head has been parsed)."""
    body = json.dumps({"error": code, "detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header and body read deadlines (see the module docstring)."""

    limits: Limits = Limits()

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._recording = _RecordingConnection(self.limits.max_header_bytes)
        self.conn = self._recording
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str = ""
        self._refused = False
        """A body announced past the limit was refused (``_refuse_body``); nothing more is sent."""

    # -- deadlines -------------------------------------------------------------------------------

    def _arm(self, phase: str, seconds: float, expired: Callable[[], None]) -> None:
        self._disarm()
        self._waiting_for = phase
        self._deadline = self.loop.call_later(seconds, expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._waiting_for = ""

    def _follow_state(self) -> None:
        """Arm the deadline that fits where the request is: its head to come, its body to come,
        or none (it is in, and the answer takes as long as it takes: event streams never end)."""
        state = self.conn.their_state
        phase = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else ""
        if phase == self._waiting_for:
            return
        if phase == "head":
            self._arm(phase, self.limits.header_timeout_s, self._head_expired)
        elif phase == "body":
            self._arm(phase, self.limits.body_timeout_s, self._body_expired)
        else:
            self._disarm()

    def _head_expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a request came, not all of its head
            detail = f"the request line and headers did not arrive within {self.limits.header_timeout_s:g} s"
            self.transport.write(json_error_bytes(408, "request_timeout", detail))
        self.transport.close()

    def _body_expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and not self._refused:
            detail = f"the request body did not arrive within {self.limits.body_timeout_s:g} s of its headers"
            self.transport.write(json_error_bytes(408, "request_timeout", detail))
        if cycle is not None:  # the application reads a disconnect; what it sends goes nowhere
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    # -- uvicorn's hooks -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        _no_delay(transport)
        super().connection_made(transport)
        self._follow_state()

    def handle_events(self) -> None:
        if self._refused:
            self._discard_body()
            return
        super().handle_events()
        if self.transport.is_closing() or self._refused:
            return
        if self._recording.announced_body() > self.limits.max_message_bytes:
            self._refuse_body()
        else:
            self._follow_state()

    def _refuse_body(self) -> None:
        """413 at once for a body announced past the limit by a chunk-size line (a Content-Length
        past it is refused by the application before it reads a byte), instead of waiting for
        a body that may never come. The answer is followed by the end of our side of the
        connection; what the client still sends is discarded until it closes or the body
        deadline ends (a close with its bytes unread could reset the connection before it read
        the answer). The application reads a disconnect."""
        self._refused = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            size = f"at least {self._recording.announced_body()}"
            detail = too_large_detail(size, self.limits.max_message_bytes)
            self.transport.write(json_error_bytes(413, "body_too_large", detail))
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.flow.resume_reading()  # uvicorn pauses a body it buffers; this one is dropped instead

    def _discard_body(self) -> None:
        """After ``_refuse_body``: read what the client still sends and drop it; close once its
        body has ended (or cannot be parsed, or the client closed its side)."""
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                self.transport.close()
                return
            if event is h11.NEED_DATA:
                return
            if not isinstance(event, h11.Data):  # the end of the body (or of what h11 can read)
                self.transport.close()
                return

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._follow_state()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        error = self._recording.last_error
        status = error.error_status_hint if error is not None else 400
        if status == 431:
            code = "headers_too_large"
            detail = f"the request line and headers are over {self.limits.max_header_bytes} bytes"
        else:
            status = status if 400 <= status < 500 else 400
            code, detail = "bad_request", f"malformed HTTP request: {error or msg}"
        self.transport.write(json_error_bytes(status, code, detail))
        self.transport.close()


def _no_delay(transport: asyncio.Transport) -> None:
    """Send small writes at once. asyncio sets TCP_NODELAY only on sockets whose protocol number
    says TCP, which a listening socket handed to uvicorn (``sockets=``, ``--fd``) often does not:
    then an answer's head and body wait on the client's delayed ACK, about 40 ms per request."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def protocol_for(limits: Limits) -> type[GuardedH11Protocol]:
    """The protocol class with these limits (uvicorn makes one instance per connection)."""
    made = type("GatewayH11Protocol", (GuardedH11Protocol,), {"limits": limits})
    return cast(type[GuardedH11Protocol], made)


def server_config(app: Any, limits: Limits, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for the gateway: the guarded protocol, the header size limit, the
    keep-alive time; ``options`` are passed on (host, port, log_level, ...)."""
    return uvicorn.Config(
        app,
        http=protocol_for(limits),
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_keep_alive=limits.keep_alive_s,
        **options,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server that, on SIGTERM, first marks the process not ready (``/readyz`` 503)
    and keeps serving for ``drain_delay_s``, so a load balancer stops sending it requests before
    it stops listening; then it shuts down as uvicorn does (a second signal: at once)."""

    def __init__(self, config: uvicorn.Config, readiness: Readiness, drain_delay_s: float = 0.0) -> None:
        super().__init__(config)
        self.readiness = readiness
        self.drain_delay_s = drain_delay_s
        self._stop_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.readiness.drain()
        if sig == signal.SIGTERM and self.drain_delay_s > 0 and self._stop_at is None:
            self._stop_at = time.monotonic() + self.drain_delay_s
            self._captured_signals.append(sig)  # re-raised after the shutdown, as uvicorn does
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self._stop_at is not None and time.monotonic() >= self._stop_at:
            self.should_exit = True
        return await super().on_tick(counter)
