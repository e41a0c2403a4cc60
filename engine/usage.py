"""What every model call the providers were sent used and cost, including the ones that never
answered (seed §5.3: cost per session, user and day is the sum over every call).

A call that answered is recorded with the provider's usage. A call that did not (cancelled by
the user, cut off by a crash, a timeout, an error) still cost what was sent and what streamed
before it stopped: it is recorded with the request's size counted before sending
(``ModelCallStarted.estimated_input_tokens``) and the tokens of the text streamed back, priced
by the agent's table and marked ``estimated``. The engine's own calls (a context summary, a
memory extraction) are ``AuxiliaryModelCall`` events with the same figures.

``LiveCall`` runs a model's stream so that a cancel can stop it at once (``stop``), instead of
letting the provider finish an answer nobody will read.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Sequence

from . import events as ev
from .models.base import ModelChunk, TextDelta, Usage
from .models.pricing import PriceTable

if TYPE_CHECKING:
    from .fold import SessionState
    from .log.base import EventLog
    from .models.tokens import TokenCounter
    from .writer import SessionWriter


@dataclass(frozen=True, slots=True)
class Spent:
    """What one call used and cost."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_micros: int = 0
    estimated: bool = False
    """The engine's counts, not the provider's usage."""


def priced(
    prices: PriceTable | None, names: Sequence[str], usage: Usage, *, estimated: bool = False
) -> Spent:
    """``usage`` with its cost under the first of ``names`` the table prices (0 if none)."""
    cost = 0
    if prices is not None:
        for name in names:
            if name and prices.price_for(name) is not None:
                cost = prices.cost_micros(
                    name, usage.input_tokens, usage.output_tokens, usage.cached_input_tokens
                )
                break
    return Spent(usage.input_tokens, usage.output_tokens, usage.cached_input_tokens, cost, estimated)


def unanswered(
    prices: PriceTable | None, model: str, sent_tokens: int, streamed: str, counter: TokenCounter
) -> Spent:
    """A call that stopped before its answer: what was sent (counted before sending) and the
    tokens of the text that streamed back, priced, marked estimated."""
    usage = Usage(sent_tokens, counter.count(streamed) if streamed else 0)
    return priced(prices, [model], usage, estimated=True)


async def open_model_call(log: EventLog, state: SessionState) -> ev.ModelCallStarted | None:
    """The running turn's model call that was started and never finished (its worker stopped
    or was killed during it), read from the log; None if there is none."""
    turn = state.turn
    if turn is None or not turn.model_call_open:
        return None
    return find_open_call(await log.read_session(state.session_id, max(turn.started_version - 1, 0)), state)


def find_open_call(events: Sequence[ev.Event], state: SessionState) -> ev.ModelCallStarted | None:
    """``open_model_call`` among ``events`` (the session's, from its running turn's start on)."""
    turn = state.turn
    if turn is None or not turn.model_call_open:
        return None
    opened = [e for e in events if isinstance(e, ev.ModelCallStarted) and e.turn_id == turn.turn_id]
    return opened[-1] if opened else None


def add_call_finished(
    w: SessionWriter,
    turn_id: str,
    step: int,
    model: str,
    status: str,
    spent: Spent,
    *,
    latency_ms: float = 0.0,
    retries: int = 0,
    finish_reason: str = "",
    error: str | None = None,
) -> None:
    w.add(
        ev.ModelCallFinished,
        turn_id=turn_id,
        step=step,
        model=model,
        status=status,
        input_tokens=spent.input_tokens,
        output_tokens=spent.output_tokens,
        cached_input_tokens=spent.cached_input_tokens,
        cost_micros=spent.cost_micros,
        estimated=spent.estimated,
        latency_ms=latency_ms,
        retries=retries,
        finish_reason=finish_reason,
        error=error,
        correlation_id=turn_id or None,
    )


def add_unfinished_call(
    w: SessionWriter, started: ev.ModelCallStarted, status: str, reason: str, prices: PriceTable | None
) -> None:
    """The result of a call whose worker stopped during it (``status`` interrupted) or whose
    turn was closed while it ran (cancelled): what was sent, nothing known to have streamed."""
    spent = priced(prices, [started.model], Usage(started.estimated_input_tokens, 0), estimated=True)
    add_call_finished(w, started.turn_id, started.step, started.model, status, spent, error=reason)


def add_auxiliary_call(
    w: SessionWriter, turn_id: str, purpose: str, model: str, spent: Spent, latency_ms: float, error: str = ""
) -> None:
    w.add(
        ev.AuxiliaryModelCall,
        turn_id=turn_id,
        purpose=purpose,
        model=model,
        status="failed" if error else "ok",
        input_tokens=spent.input_tokens,
        output_tokens=spent.output_tokens,
        cached_input_tokens=spent.cached_input_tokens,
        cost_micros=spent.cost_micros,
        latency_ms=latency_ms,
        estimated=spent.estimated,
        error=error,
        correlation_id=turn_id or None,
    )


class LiveCall:
    """A model stream read by the turn's own task, so ``stop()`` (a cancel, from another task)
    ends it at once: when the reader is waiting for the model, its task is cancelled at that
    await, as ``asyncio.timeout`` does (the provider's stream closes), and the iteration ends;
    between chunks it ends before the next is asked for. ``streamed`` is the answer text that
    had arrived. (No task or queue of its own: that cost a task per model call and a loop
    iteration per chunk.)"""

    def __init__(self, chunks: AsyncIterator[ModelChunk]) -> None:
        self.stopped = False
        self.streamed: list[str] = []
        self._source = chunks
        self._waiting: asyncio.Task[Any] | None = None
        """The reader's task while it waits for the model's next chunk."""

    def stop(self) -> None:
        if self.stopped:
            return  # one cancel: a second would look like someone else's
        self.stopped = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def chunks(self) -> AsyncIterator[ModelChunk]:
        try:
            while not self.stopped:
                item = await self._next()
                if item is None:
                    return
                if isinstance(item, TextDelta):
                    self.streamed.append(item.text)
                yield item
        finally:
            aclose = getattr(self._source, "aclose", None)
            if aclose is not None:
                await aclose()  # a stream not read to its end is closed (no-op if it ended)

    async def _next(self) -> ModelChunk | None:
        """The next chunk; None when the stream ends or ``stop()`` cut it off."""
        task = asyncio.current_task()
        self._waiting = task
        try:
            return await anext(self._source)
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            if not self.stopped or task is None or task.uncancel() > 0:
                raise  # not (only) our stop: a cancel of the turn itself goes on
            return None
        finally:
            self._waiting = None


__all__ = [
    "LiveCall",
    "Spent",
    "add_auxiliary_call",
    "add_call_finished",
    "add_unfinished_call",
    "find_open_call",
    "open_model_call",
    "priced",
    "unanswered",
]
