"""What a route opens for as long as its answer lasts (an event stream's slot, a hub
subscription), owned by that answer, so it is released however the request ends: the answer
sent in full, a client gone before the first byte or half-way, a HEAD, an error in the handler or
while streaming.

A streaming answer's body is a generator that may never start (a client that hangs up first has
the answer cancelled before it pulls the first item), and a generator that never started runs no
``finally``: so the body cannot be what releases. The answer can: the server calls the answer
the handler returned, and ``HeldAnswer.__call__``'s ``finally`` runs however that call ends. A
handler takes what it needs inside ``with Holdings() as held``: an error before it returns its
answer releases everything taken so far.
"""

from __future__ import annotations

from types import TracebackType
from typing import Callable

import structlog
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

Release = Callable[[], None]
log = structlog.get_logger("turnlog.gateway")


class Holdings:
    """What one request holds: released once, newest first, by its answer or by an error."""

    def __init__(self) -> None:
        self._releases: list[Release] = []

    def hold(self, release: Release) -> None:
        """Hold something until the answer ends; ``release`` gives it back."""
        self._releases.append(release)

    def release(self) -> None:
        """Give back everything held (a release that fails is logged; the others still run)."""
        releases, self._releases = self._releases, []
        for release in reversed(releases):
            try:
                release()
            except Exception:
                log.exception("gateway.release_failed", release=getattr(release, "__qualname__", "?"))

    def answer(self, response: Response) -> Response:
        """``response``, owning what is held from now on."""
        return HeldAnswer(response, self)

    def __enter__(self) -> Holdings:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:  # the handler failed before its answer took over
            self.release()


class HeldAnswer(Response):
    """An answer that releases its request's holdings when it ends. A HEAD gets the answer's
    status and headers and no body: its stream is never started."""

    def __init__(self, inner: Response, holdings: Holdings) -> None:
        self.inner = inner
        self.holdings = holdings
        self.status_code = inner.status_code
        self.raw_headers = inner.raw_headers
        self.background: BackgroundTask | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope.get("method") == "HEAD":
                await send(
                    {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
                )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await self.inner(scope, receive, send)
        finally:
            self.holdings.release()
