"""``turnlog.engine.usage.LiveCall``: the turn reads a model stream in its own task, and a cancel from
another task (``LiveCall.stop``) ends it at once without ending the turn's task; a cancel of
the turn's task itself still goes through, also when it comes together with a stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from turnlog.engine.models.base import ModelChunk, TextDelta
from turnlog.engine.usage import LiveCall


class Stream:
    """A model stream: sends ``texts``, then waits until it is closed or cancelled."""

    def __init__(self, *texts: str) -> None:
        self.texts = texts
        self.waiting = asyncio.Event()
        self.ended_by: str = ""

    async def chunks(self) -> AsyncIterator[ModelChunk]:
        try:
            for text in self.texts:
                yield TextDelta(text)
            self.waiting.set()
            await asyncio.Event().wait()  # a long answer that never finishes
        except asyncio.CancelledError:
            self.ended_by = "cancelled"
            raise
        except GeneratorExit:
            self.ended_by = "closed"
            raise


async def read(live: LiveCall) -> list[str]:
    return [c.text async for c in live.chunks() if isinstance(c, TextDelta)]


@pytest.mark.asyncio
async def test_a_stop_while_the_model_is_awaited_ends_the_stream_and_not_the_task() -> None:
    stream = Stream("Half ", "an answer")
    live = LiveCall(stream.chunks())
    reader = asyncio.create_task(read(live))
    await stream.waiting.wait()
    live.stop()
    assert await asyncio.wait_for(reader, 5) == ["Half ", "an answer"]  # the task returns normally
    assert stream.ended_by == "cancelled"  # the provider's stream was cut at its await
    assert live.stopped and live.streamed == ["Half ", "an answer"]
    assert reader.cancelling() == 0


@pytest.mark.asyncio
async def test_a_stop_between_chunks_ends_before_the_next_is_asked_for() -> None:
    stream = Stream("one", "two", "three")
    live = LiveCall(stream.chunks())
    got = []
    async for chunk in live.chunks():
        assert isinstance(chunk, TextDelta)
        got.append(chunk.text)
        live.stop()  # from the consumer's side, while it holds the first chunk
        live.stop()  # a second stop changes nothing
    assert got == ["one"]
    assert stream.ended_by == "closed"


@pytest.mark.asyncio
async def test_a_cancel_of_the_turn_goes_through_even_with_a_stop() -> None:
    for with_stop in (False, True):
        stream = Stream("x")
        live = LiveCall(stream.chunks())
        reader = asyncio.create_task(read(live))
        await stream.waiting.wait()
        reader.cancel()  # the worker shutting down
        if with_stop:
            live.stop()  # and a user's cancel in the same instant
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert stream.ended_by == "cancelled"
