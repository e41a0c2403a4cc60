"""``turnlog.engine.models.limits.stream_within``: the first-token and total-response limits on a model's
stream, kept with one timer per call. A limit is met only while the stream waits for the model:
the consumer's own work between chunks is never cancelled; a cancel from outside is never
mistaken for a timeout, and a timeout leaves the reading task with no cancel pending."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from turnlog.engine.errors import ModelTimeoutError
from turnlog.engine.models.base import Model, ModelChunk, ModelRequest, ModelResponse, TextDelta
from turnlog.engine.models.limits import stream_within


class Paced(Model):
    """Yields a delta after each pause in ``pauses``, then the response."""

    name = "paced"

    def __init__(self, pauses: Sequence[float], hint: str = "") -> None:
        self.pauses = pauses
        self.timeout_hint = hint
        self.closed = False

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        try:
            for i, pause in enumerate(self.pauses):
                await asyncio.sleep(pause)
                yield TextDelta(f"d{i}")
            yield ModelResponse(text="done")
        finally:
            self.closed = True


async def texts(model: Model, first_s: float, total_s: float, between_s: float = 0.0) -> list[str]:
    got = []
    async for chunk in stream_within(model, ModelRequest(messages=()), first_s, total_s):
        got.append(chunk.text if isinstance(chunk, TextDelta) else "response")
        if between_s:
            await asyncio.sleep(between_s)  # the consumer's own work
    return got


async def test_a_stream_within_both_limits_passes_whole_and_leaves_no_timer() -> None:
    loop = asyncio.get_running_loop()
    model = Paced([0.0, 0.03, 0.03, 0.03])  # past the first-token limit overall, not for the first chunk
    assert await texts(model, first_s=0.05, total_s=5) == ["d0", "d1", "d2", "d3", "response"]
    assert model.closed
    await asyncio.sleep(0.1)  # the first-token deadline passes: nothing is cancelled now
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
    assert all(h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]


async def test_no_first_chunk_in_time_is_the_first_token_limit_with_the_models_hint() -> None:
    model = Paced([1.0], hint="start the model server first")
    with pytest.raises(ModelTimeoutError) as raised:
        await texts(model, first_s=0.05, total_s=5)
    assert raised.value.limit == "first-token"
    assert raised.value.seconds == 0.05
    assert "start the model server first" in str(raised.value)
    assert model.closed
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_a_stall_after_the_first_chunk_is_the_total_response_limit() -> None:
    model = Paced([0.0, 1.0])
    got: list[str] = []
    with pytest.raises(ModelTimeoutError) as raised:
        async for chunk in stream_within(model, ModelRequest(messages=()), 0.05, 0.15):
            got.append(chunk.text if isinstance(chunk, TextDelta) else "response")
    assert (raised.value.limit, raised.value.seconds) == ("total-response", 0.15)
    assert got == ["d0"]


async def test_a_first_token_limit_past_the_total_one_is_reported_as_the_total() -> None:
    with pytest.raises(ModelTimeoutError) as raised:
        await texts(Paced([1.0]), first_s=5, total_s=0.05)
    assert raised.value.limit == "total-response"


async def test_the_consumers_work_between_chunks_is_never_cancelled_by_a_limit() -> None:
    # the total limit passes while the consumer sleeps after d0: its sleep completes, and the
    # stream then refuses to ask the model for more
    consumer_slept: list[str] = []
    with pytest.raises(ModelTimeoutError) as raised:
        async for chunk in stream_within(Paced([0.0, 0.0]), ModelRequest(messages=()), 5, 0.05):
            await asyncio.sleep(0.1)
            consumer_slept.append(chunk.text if isinstance(chunk, TextDelta) else "response")
    assert raised.value.limit == "total-response"
    assert consumer_slept == ["d0"]


async def test_a_cancel_from_outside_goes_through_as_a_cancel_not_a_timeout() -> None:
    reader = asyncio.create_task(texts(Paced([10.0]), first_s=5, total_s=10))
    await asyncio.sleep(0.05)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader


async def test_a_cancel_from_outside_together_with_a_timeout_goes_through_as_a_cancel() -> None:
    class CancelledTwice(Model):
        """When the first-token limit cancels it, someone else cancels the task too."""

        name = "twice"

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                raise
            yield ModelResponse(text="never")

    async def read() -> None:
        async for _ in stream_within(CancelledTwice(), ModelRequest(messages=()), 0.05, 10):
            pass

    reader = asyncio.create_task(read())
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert reader.cancelled()


async def test_a_model_that_swallows_the_cancel_still_times_out_and_leaves_no_cancel_pending() -> None:
    class Stubborn(Model):
        name = "stubborn"

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                pass  # a misbehaving client library
            yield TextDelta("late")
            yield ModelResponse(text="late")

    got: list[str] = []
    with pytest.raises(ModelTimeoutError):
        async for chunk in stream_within(Stubborn(), ModelRequest(messages=()), 0.05, 10):
            got.append(type(chunk).__name__)
    assert got == ["TextDelta"]  # the chunk that came through the cancel, then the limit
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
