"""Time limits on a model's stream (seed §5.3): to the first chunk, and for the whole response.

Both are the engine's, separate from the HTTP client's own timeouts. A model may set its own
limits (``Model.first_token_timeout_s`` / ``response_timeout_s``); otherwise the agent's apply.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from ..errors import ModelTimeoutError
from .base import Model, ModelChunk, ModelRequest


async def stream_within(
    model: Model, request: ModelRequest, first_token_s: float, response_s: float
) -> AsyncIterator[ModelChunk]:
    """The model's chunks, or ModelTimeoutError naming the limit that was hit."""
    first_token_s = model.first_token_timeout_s or first_token_s
    response_s = model.response_timeout_s or response_s
    chunks = model.stream(request).__aiter__()
    now = asyncio.get_running_loop().time()
    deadline = now + response_s
    first_deadline = min(now + first_token_s, deadline)
    first = True
    try:
        while True:
            # the timeout wraps only the await, never the yield: cancelling must hit the model
            # call, not whatever the consumer of this stream does between chunks
            limit = asyncio.timeout_at(first_deadline if first else deadline)
            try:
                async with limit:
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not limit.expired():
                    raise
                if first and first_deadline < deadline:
                    raise ModelTimeoutError("first-token", first_token_s, model.timeout_hint) from None
                raise ModelTimeoutError("total-response", response_s, model.timeout_hint) from None
            first = False
            yield chunk
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
