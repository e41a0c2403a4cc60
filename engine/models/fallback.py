"""Retry on the backup model, then degrade (seed §5.3, §8).

``FallbackModel`` tries its models in order: the agent's model, its backup (once: a failed call is
never retried on the same model), and last the rule-based responder. Each model runs within its
own time limits, so a primary that hangs before its first token hands over to the backup instead
of failing the whole call. Every hand-over is streamed as a ``ModelSwitch`` with its reason, and
the engine records it as a ``ModelFallback`` event. When the next model has a smaller context
window, the request is refitted to it first: the oldest exchanges go, whole, never a tool call
without its result.

Which model a call starts with is the endpoints' breakers' decision (engine.models.breaker): a
model whose endpoint's breaker is open is passed over (a ``ModelSwitch`` with cause
``breaker_open``, the model never called), and a call waiting on an endpoint whose breaker
opens is handed to the next model the same way. The breakers are the request's ``endpoints``
(the process's), or this chain's own when the request carries none.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import AsyncGenerator, AsyncIterator, Sequence

from ..errors import ConfigurationError, ContextLengthError, ModelError
from ..messages import ChatMessage
from .base import (
    EndpointWait,
    Model,
    ModelChunk,
    ModelCorrection,
    ModelRequest,
    ModelResponse,
    ModelSwitch,
    TextDelta,
)
from .breaker import Attempt, BreakerOpenError
from .endpoints import Endpoints
from .limits import stream_within
from .tokens import TokenCounter

DEFAULT_FIRST_TOKEN_S = 15.0
DEFAULT_RESPONSE_S = 120.0
REPLY_RESERVE_TOKENS = 1024
"""Room kept free in a smaller window for the answer."""
FAILED = "failed"
BREAKER_OPEN = "breaker_open"


class FallbackModel(Model):
    """The agent's model, then its backup, then (optionally) a degraded responder."""

    def __init__(
        self,
        primary: Model,
        backup: Model | None = None,
        degraded: Model | None = None,
        *,
        first_token_s: float = DEFAULT_FIRST_TOKEN_S,
        response_s: float = DEFAULT_RESPONSE_S,
        endpoints: Endpoints | None = None,
    ) -> None:
        self.endpoints = endpoints or Endpoints()
        """The breakers used when a request carries no registry of its own."""
        self.chain: list[Model] = [m for m in (primary, backup, degraded) if m is not None]
        self.context_window = primary.context_window
        """Budgets follow the primary; a backup with a smaller window gets the request refitted."""
        if backup is not None and backup.name == primary.name:
            raise ConfigurationError(f"the backup model must differ from the primary ({primary.name!r})")
        self.degraded = degraded
        self.name = primary.name
        self.first_token_s = first_token_s
        self.response_s = response_s
        # the engine's own limits must cover the whole chain; each link has its own inside
        self.first_token_timeout_s = sum(m.response_timeout_s or response_s for m in self.chain) + 1
        self.response_timeout_s = self.first_token_timeout_s

    async def aclose(self) -> None:
        for model in self.chain:
            await model.aclose()

    @property
    def token_counter(self) -> TokenCounter:
        return self.chain[0].token_counter

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        return await self.chain[0].estimate_input_tokens(request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        endpoints = request.endpoints or self.endpoints
        for position, model in enumerate(self.chain):
            following = self.chain[position + 1] if position + 1 < len(self.chain) else None
            attempt = _admit(endpoints, model, movable=following is not None)
            if isinstance(attempt, str):
                assert following is not None
                reason = f"{attempt}; the call starts on {following.name}"
                yield ModelSwitch(
                    model.name, following.name, reason, following is self.degraded, BREAKER_OPEN
                )
                yield TextDelta("")  # the chain is alive: the switch counts as output
                continue
            try:
                async with contextlib.aclosing(self._call(model, request, attempt)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            except ModelError as exc:
                if attempt is not None:
                    attempt.breaker.failed(attempt, exc)
                    for change in attempt.take_reports():
                        yield change
                if following is None or isinstance(exc, ContextLengthError):
                    raise  # a too-long context is the engine's to compact, not a reason to switch
                cause = BREAKER_OPEN if isinstance(exc, BreakerOpenError) else FAILED
                reason = f"{type(exc).__name__}: {exc}"
                yield ModelSwitch(model.name, following.name, reason, following is self.degraded, cause)
                yield TextDelta("")  # the chain is alive: the switch counts as output
            finally:
                if attempt is not None and not attempt.settled:
                    attempt.breaker.released(attempt)  # cancelled: it tells nothing about the endpoint

    async def _call(
        self, model: Model, request: ModelRequest, attempt: Attempt | None
    ) -> AsyncGenerator[ModelChunk, None]:
        """One model's stream within its limits, followed by its endpoint's breaker."""
        fitted = await refit(request, model)  # a request too long for it tells nothing of the endpoint
        if attempt is not None:
            attempt.breaker.sent(attempt)
        limited = stream_within(model, fitted, self.first_token_s, self.response_s, attempt)
        async with contextlib.aclosing(limited) as chunks:
            async for chunk in chunks:
                if attempt is not None:
                    _follow(attempt, chunk)
                    if isinstance(chunk, ModelResponse):
                        attempt.breaker.succeeded(attempt)
                        for change in attempt.take_reports():
                            yield change
                yield chunk


def _follow(attempt: Attempt, chunk: ModelChunk) -> None:
    """Tell the endpoint's breaker how the call goes: queued by the limiter, sent, first token."""
    if attempt.answered:
        return
    if isinstance(chunk, EndpointWait):
        (attempt.breaker.sent if chunk.over else attempt.breaker.queued)(attempt)
    elif isinstance(chunk, (TextDelta, ModelResponse, ModelCorrection)):
        attempt.breaker.answered(attempt)


def _admit(endpoints: Endpoints, model: Model, *, movable: bool) -> Attempt | str | None:
    """The call's attempt on the model's endpoint, or why its breaker turns it away (None: the
    model has no endpoint). The chain's last model is never turned away, only counted."""
    endpoint = model.endpoint
    if endpoint is None:
        return None
    breaker = endpoints.breaker(endpoint)
    return breaker.admit(model.name) if movable else breaker.track(model.name)


async def refit(request: ModelRequest, model: Model) -> ModelRequest:
    """The request, shortened from its oldest exchanges until it fits the model's window."""
    window = model.context_window
    if window is None:
        return request
    budget = window - REPLY_RESERVE_TOKENS
    messages = list(request.messages)
    while await model.estimate_input_tokens(_with(request, messages)) > budget:
        shorter = drop_oldest_exchange(messages)
        if shorter is None:
            raise ModelError(
                f"the request does not fit {model.name!r}'s context window of {window} tokens even "
                "with only the current exchange left"
            )
        messages = shorter
    return _with(request, messages)


def drop_oldest_exchange(messages: Sequence[ChatMessage]) -> list[ChatMessage] | None:
    """Without the oldest user message and everything up to the next user message (its answer,
    its tool calls and their results); system messages stay. None if only one exchange is left."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if len(users) < 2:
        return None
    start, end = users[0], users[1]
    return [m for i, m in enumerate(messages) if not (start <= i < end) or m.role == "system"]


def _with(request: ModelRequest, messages: list[ChatMessage]) -> ModelRequest:
    return dataclasses.replace(request, messages=messages)
