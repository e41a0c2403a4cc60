"""Time limits on a model's stream (seed §5.3): to the first chunk, and for the whole response.

Both are the engine's, separate from the HTTP client's own timeouts. A model may set its own
limits (``Model.first_token_timeout_s`` / ``response_timeout_s``); otherwise the agent's apply.

One timer serves a whole call (armed for the first chunk, moved once to the response deadline),
not a timer per chunk: a streamed answer has hundreds of chunks, and an ``asyncio.timeout``
around each await cost a context object and a timer heap entry per chunk.

An ``EndpointWait`` (the call queued by its endpoint's client-side limits) is not a first
token: the wait counts against the first-token limit. A call may be ``cut`` before its first
token by someone else (``watch``: the endpoint's breaker, when it opens): it then ends with the
error it was cut with, the same way a limit ends it.
"""

from __future__ import annotations

import asyncio
from typing import AsyncGenerator, Callable, Protocol

from ..errors import ModelError, ModelTimeoutError
from .base import EndpointWait, Model, ModelChunk, ModelRequest

FIRST_TOKEN = "first-token"
TOTAL_RESPONSE = "total-response"


class Watch(Protocol):
    def attach(self, cut: Callable[[ModelError], None]) -> None:
        """Receive the function that ends the call before its first token."""


class _Deadline:
    """Cancels the reading task when the active limit passes while it waits for the model;
    a limit that passes between chunks is met before the next chunk is asked for. As with
    ``asyncio.timeout``, the cancel is told apart from anyone else's by ``Task.uncancel``.

    One timer: armed at the first-token deadline; if the first chunk came before it, it moves
    itself to the response deadline when it fires (a call that ends first never moves it)."""

    __slots__ = (
        "loop", "handle", "limit", "response_at", "answered", "expired", "waiting", "cancelling", "error",
    )  # fmt: skip

    def __init__(self, loop: asyncio.AbstractEventLoop, first_token_at: float, response_at: float) -> None:
        self.loop = loop
        self.response_at = response_at
        self.limit = FIRST_TOKEN if first_token_at < response_at else TOTAL_RESPONSE
        self.answered = False
        """The first chunk has come: only the response deadline is left."""
        self.expired = False
        self.waiting: asyncio.Task[object] | None = None
        """The task waiting for the model's next chunk (None between chunks)."""
        self.cancelling = 0
        """That task's ``cancelling()`` count when it started waiting."""
        self.error: ModelError | None = None
        """What ``cut`` ended the call with (None: a limit ended it)."""
        self.handle: asyncio.TimerHandle | None = loop.call_at(min(first_token_at, response_at), self._fire)

    def _fire(self) -> None:
        if self.limit == FIRST_TOKEN and self.answered:
            self.limit = TOTAL_RESPONSE
            self.handle = self.loop.call_at(self.response_at, self._fire)
            return
        self.handle = None
        self.expired = True
        if self.waiting is not None:
            self.waiting.cancel()

    def cut(self, error: ModelError) -> None:
        """End the call now with ``error``, if its first chunk has not come (else: no effect)."""
        if self.answered or self.expired:
            return
        self.error = error
        self.disarm()
        self.expired = True
        if self.waiting is not None:
            self.waiting.cancel()

    def ours(self, task: asyncio.Task[object] | None) -> bool:
        """Whether a CancelledError the waiting ``task`` got was this deadline's alone."""
        return self.expired and task is not None and task.uncancel() <= self.cancelling

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


async def stream_within(
    model: Model, request: ModelRequest, first_token_s: float, response_s: float, watch: Watch | None = None
) -> AsyncGenerator[ModelChunk, None]:
    """The model's chunks, or ModelTimeoutError naming the limit that was hit (or the error a
    ``watch`` cut the call with)."""
    first_token_s = model.first_token_timeout_s or first_token_s
    response_s = model.response_timeout_s or response_s
    chunks = model.stream(request).__aiter__()
    loop = asyncio.get_running_loop()
    now = loop.time()
    timer = _Deadline(loop, now + first_token_s, now + response_s)
    if watch is not None:
        watch.attach(timer.cut)
    try:
        while True:
            # the limit applies only while this waits for the model, never while the consumer
            # of this stream works between chunks: a cancel must hit the model call
            if timer.expired:
                raise _ended(timer, first_token_s, response_s, model.timeout_hint)
            task = asyncio.current_task()
            timer.waiting, timer.cancelling = task, task.cancelling() if task is not None else 0
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if not timer.ours(task):
                    raise
                raise _ended(timer, first_token_s, response_s, model.timeout_hint) from None
            finally:
                timer.waiting = None
            if timer.expired:  # the model went on through the cancel: take the cancel back
                timer.ours(task)
            if not isinstance(chunk, EndpointWait):
                timer.answered = True
            yield chunk
    finally:
        timer.disarm()
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def _ended(timer: _Deadline, first_token_s: float, response_s: float, hint: str) -> ModelError:
    return timer.error or _timed_out(timer.limit, first_token_s, response_s, hint)


def _timed_out(limit: str, first_token_s: float, response_s: float, hint: str) -> ModelTimeoutError:
    return ModelTimeoutError(limit, first_token_s if limit == FIRST_TOKEN else response_s, hint)
