"""A Model for any server that speaks the OpenAI Chat Completions API.

OpenAI, vLLM, llama.cpp, Ollama, LM Studio and most hosted gateways accept the same streaming
``/v1/chat/completions`` request, so one adapter reaches all of them. It translates turnlog's
provider-neutral ChatMessages into OpenAI message dicts, streams the answer as TextDelta chunks,
and reassembles the tool calls that arrive in fragments into complete ToolCallSpecs.

Two rules shape the code:

* Only a complete message becomes a ModelResponse. If the stream breaks (a dropped connection,
  a server error mid-answer, a stream that ends before the model finished) the call raises
  ModelError and yields no ModelResponse, so a half-streamed answer never reaches history.
* Every failure is a ModelError whose message names the endpoint and the model and says what
  to check (engine.models.openai_errors), because the person reading it is usually configuring
  a server URL. Retries and overall time limits belong to the engine, so the SDK's own retries
  default to 0. The one resend here is not a retry of a failed call: a request the server
  closed the connection on before answering (a kept-alive connection it had just timed out) is
  sent again, once.

Calls go through the endpoint's client-side limiter (engine.models.ratelimit): ``limits`` caps
calls in flight, requests and tokens per minute, and a 429 whose reset is at most
``limits.max_retry_wait_s`` away holds the endpoint until then and queues the call again: the
server did not take the request, so this is not a retry of a failed call either. The limiter
and the endpoint's breaker live in the request's ``endpoints`` (the process's registry).

The SDK sends the request and maps HTTP errors; the stream's server-sent events are read as
plain JSON (``with_streaming_response``), not built into the SDK's typed chunk objects: that
typing was the largest CPU cost of a model call, and a worker running hundreds of turns at once
is bound by its CPU. For the same reason the SDK runs on its aiohttp transport (the SDK's advice
for concurrency): the default one's cost per call grows with the calls in flight (bench/README.md
§12 has the figures).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, AsyncIterator, Sequence

import httpx2
import openai

from ..errors import ModelError
from ..events import ToolCallSpec
from ..messages import ChatMessage
from .base import EndpointWait, Model, ModelChunk, ModelRequest, ModelResponse, TextDelta, Usage
from .breaker import BreakerPolicy
from .connections import ModelConnections
from .endpoints import Endpoint, Endpoints
from .openai_errors import EXCERPT_CHARS, closed_before_answering, endpoint_error, excerpt
from .ratelimit import EndpointLimits, Limiter, Ticket, reset_after
from .tokens import ServerTokenCounter, TiktokenCounter, TokenCounter, count_chat_tokens, encoding_name_for


def to_openai_message(message: ChatMessage) -> dict[str, Any]:
    """One ChatMessage as an OpenAI chat message dict."""
    if message.role == "assistant":
        converted: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            converted["tool_calls"] = [_to_openai_tool_call(c) for c in message.tool_calls]
        return converted
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    return {"role": message.role, "content": message.content}


def _to_openai_tool_call(call: ToolCallSpec) -> dict[str, Any]:
    function = {"name": call.name, "arguments": call.arguments_json}
    return {"id": call.call_id, "type": "function", "function": function}


def to_openai_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    return [to_openai_message(m) for m in messages]


def to_openai_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool specs {name, description, parameters} in OpenAI's function-tool format."""
    return [{"type": "function", "function": dict(spec)} for spec in tools]


@dataclass(slots=True)
class _ToolCallParts:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _StreamState:
    """What the chunks of one streamed answer add up to."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str = ""

    def add(self, chunk: dict[str, Any]) -> str:
        """Fold one chat.completion.chunk (its JSON) in; return its new answer text (may be "")."""
        self.model = chunk.get("model") or self.model
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details")
            cached = (details.get("cached_tokens") if isinstance(details, dict) else None) or 0
            self.usage = Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0, cached)
        text = ""
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) not in (0, None):
                continue  # only the first choice is ever asked for (n=1)
            delta = choice.get("delta") or {}
            if delta.get("content"):
                text += delta["content"]
            for fragment in delta.get("tool_calls") or ():
                self._add_tool_fragment(fragment)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if text:
            self.text.append(text)
        return text

    def _add_tool_fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        parts = self.calls.setdefault(index if index is not None else len(self.calls), _ToolCallParts())
        parts.call_id = parts.call_id or fragment.get("id") or ""
        function = fragment.get("function")
        if function:
            parts.name = parts.name or function.get("name") or ""
            if function.get("arguments"):
                parts.arguments.append(function["arguments"])

    def tool_calls(self) -> tuple[ToolCallSpec, ...]:
        return tuple(
            ToolCallSpec(p.call_id or f"call_{uuid.uuid4().hex[:24]}", p.name, "".join(p.arguments))
            for _, p in sorted(self.calls.items())
        )


class OpenAICompatibleModel(Model):
    """Streams chat completions from an OpenAI-compatible endpoint."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        request_timeout_s: float = 120.0,
        max_retries: int = 0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        token_counter: TokenCounter | None = None,
        limits: EndpointLimits | None = None,
        breaker: BreakerPolicy | None = None,
        endpoints: Endpoints | None = None,
        connections: ModelConnections | None = None,
    ) -> None:
        """``limits``: what this process may send the endpoint (none by default); ``breaker``:
        when its circuit breaker opens (engine.models.breaker); ``endpoints``: the registry used
        when a request carries none (by default one of the model's own); ``connections``: the
        client's pool (engine.models.connections; ignored with a ``client`` of your own)."""
        self.name = model
        self.provider_model = model
        """The model name sent to the endpoint; ``name`` is what turnlog records (a router renames it)."""
        self.request_timeout_s = request_timeout_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        """Cap on one answer's length (a small model can run away); None leaves it to the server."""
        self._token_counter = token_counter
        self._owns_client = client is None
        self.connections = connections or ModelConnections()
        self._client = client or openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "unused",
            timeout=request_timeout_s,
            max_retries=max_retries,
            http_client=openai.DefaultAioHttpClient(
                timeout=request_timeout_s, limits=_pool(self.connections)
            ),
        )
        self.endpoints = endpoints or Endpoints()
        self._endpoint = Endpoint(
            self.base_url,
            model,
            limits or EndpointLimits(),
            breaker or BreakerPolicy(),
            self.connections.max_connections if client is None else None,
        )

    @property
    def base_url(self) -> str:
        return str(self._client.base_url).rstrip("/")

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    @property
    def limits(self) -> EndpointLimits:
        return self._endpoint.limits

    async def aclose(self) -> None:
        """Close the HTTP client if this model created it; a client passed in stays open."""
        if self._owns_client:
            await self._client.close()

    @property
    def token_counter(self) -> TokenCounter:
        """The tokenizer estimates use: the one given, else tiktoken's encoding for the model name."""
        if self._token_counter is None:
            self._token_counter = TiktokenCounter(encoding_name_for(self.provider_model))
        return self._token_counter

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        counter = self.token_counter
        if isinstance(counter, ServerTokenCounter):  # a blocking request to a local server
            return await asyncio.to_thread(count_chat_tokens, counter, request.messages, request.tools)
        return count_chat_tokens(counter, request.messages, request.tools)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        limiter = (request.endpoints or self.endpoints).limiter(self._endpoint)
        cost = await self._cost(request)
        ticket: Ticket | None = None
        used: int | None = None
        try:
            for requeue in range(1 + _REQUEUES_ON_429):
                ticket = limiter.admit_now(request.session_id, cost)
                if ticket is None:
                    self._refuse_long_hold(limiter)
                    yield EndpointWait(self.name, limiter.waiting_for(cost), limiter.queued)
                    ticket = await limiter.admit(request.session_id, cost)
                    yield EndpointWait(self.name, "", over=True)
                try:
                    opened, response = await self._send(request)
                    break
                except _RateLimited as limited:
                    wait = limited.wait_s
                    if wait is not None:  # every call waits for the reset, or fails over if it is too far
                        limiter.hold(wait, f"the endpoint answered 429 ({limited.excerpt})")
                    limiter.release(ticket, 0)  # after the hold: no queued call goes out before it
                    ticket = None
                    if wait is None or wait > self.limits.max_retry_wait_s or requeue == _REQUEUES_ON_429:
                        raise limited.error from None
            answer = None
            reading = self._read(opened, response, request)
            try:
                async for chunk in reading:
                    if isinstance(chunk, ModelResponse):
                        answer = chunk
                    else:
                        yield chunk
            finally:
                await reading.aclose()  # a call given up mid-stream closes its response now
            assert answer is not None
            used = answer.usage.input_tokens + answer.usage.output_tokens
        finally:
            if ticket is not None:
                limiter.release(ticket, used)
        yield answer

    async def _cost(self, request: ModelRequest) -> int:
        """What the request counts against a tokens-per-minute limit: its input, estimated, and
        its answer cap (as providers count it); 0 without such a limit."""
        if self.limits.tokens_per_minute is None:
            return 0
        caps = [n for n in (self.max_tokens, request.max_output_tokens) if n is not None]
        return await self.estimate_input_tokens(request) + (min(caps) if caps else 0)

    def _refuse_long_hold(self, limiter: Limiter) -> None:
        """A 429 asked for a wait longer than the limits allow: fail over now, not after it."""
        left = limiter.held_until - limiter.clock.now()
        if left > self.limits.max_retry_wait_s:
            raise ModelError(
                f"model endpoint {self.base_url} asked to wait {left:.1f} s before more calls of model "
                f"{self.name!r} ({limiter.hold_reason}), longer than its limits' max_retry_wait_s of "
                f"{self.limits.max_retry_wait_s:g} s; the call goes to the next model"
            )

    async def _read(
        self, opened: Any, response: Any, request: ModelRequest
    ) -> AsyncGenerator[TextDelta | ModelResponse, None]:
        """The answer's text as it streams, then the complete response."""
        state = _StreamState()
        try:
            chunks = _chunks(response.iter_lines()).__aiter__()
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except _StreamedError as exc:
                    raise ModelError(
                        f"model endpoint {self.base_url} reported an error mid-answer for model "
                        f"{self.name!r}: {exc}; the partial answer was discarded"
                    ) from None
                except Exception as exc:
                    raise self._error(exc, streaming=True) from exc
                text = state.add(chunk)
                if text:
                    yield TextDelta(text)
        finally:
            await opened.__aexit__(None, None, None)
        yield self._response(state, request)

    async def _send(self, request: ModelRequest) -> tuple[Any, Any]:
        """The streaming request, sent: its context and its response (headers read).

        A request the server closed the connection on before answering is sent once more, on
        another connection: that is how a kept-alive connection ends when the server's keep-alive
        timeout (5 s in llama.cpp's, uvicorn's and Node's servers, the same as the client's) runs
        out just as the client reuses it, and the server never saw the request. Nothing has
        been streamed yet, so the resend is invisible; a second close is the server's answer.
        """
        for attempt in range(1 + _RESENDS_ON_CLOSE):
            opened = self._open(request)
            try:
                return opened, await opened.__aenter__()
            except Exception as exc:
                if attempt < _RESENDS_ON_CLOSE and closed_before_answering(exc):
                    continue
                error = self._error(exc, streaming=False)
                if isinstance(exc, openai.APIStatusError) and exc.status_code == 429:
                    raise _RateLimited(reset_after(exc.response.headers), error, excerpt(exc)) from exc
                raise error from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _open(self, request: ModelRequest) -> Any:
        """The streaming request, not sent yet: entering it sends it (an HTTP error raises)."""
        # The history and the tools are plain JSON already: they go in ``extra_body`` (the SDK's
        # documented way to send JSON as is), because the SDK's typed transform walks every
        # message of every request (a few ms a call, growing with the history); ``messages``
        # then only satisfies the signature and ``extra_body`` overrides it.
        body: dict[str, Any] = {"messages": to_openai_messages(request.messages)}
        if request.tools:
            body["tools"] = to_openai_tools(request.tools)
        kwargs: dict[str, Any] = {
            "model": self.provider_model,
            "messages": [],
            "stream": True,
            "stream_options": {"include_usage": True},
            "extra_body": body,
        }
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        caps = [n for n in (self.max_tokens, request.max_output_tokens) if n is not None]
        if caps:
            kwargs["max_tokens"] = min(caps)
        if request.stop:
            kwargs["stop"] = list(request.stop)
        return self._client.chat.completions.with_streaming_response.create(**kwargs)

    def _response(self, state: _StreamState, request: ModelRequest) -> ModelResponse:
        text = "".join(state.text)
        calls = state.tool_calls()
        if not text and not calls and not request.stop:  # with stop texts, stopping at once is an answer
            raise ModelError(
                f"model endpoint {self.base_url} returned an empty response for model {self.name!r} "
                f"(finish_reason={state.finish_reason!r}); check the model is loaded and the prompt fits"
            )
        if state.finish_reason is None:
            raise ModelError(
                f"the stream from {self.base_url} for model {self.name!r} ended before the model finished "
                "(no finish_reason); the partial answer was discarded"
            )
        usage = state.usage or self._estimate_usage(request, text, calls)
        return ModelResponse(text, calls, usage, state.finish_reason, state.model or self.provider_model)

    def _error(self, exc: Exception, *, streaming: bool) -> ModelError:
        return endpoint_error(
            exc, where=self.base_url, model=self.name, timeout_s=self.request_timeout_s, streaming=streaming
        )

    def _estimate_usage(self, request: ModelRequest, text: str, calls: tuple[ToolCallSpec, ...]) -> Usage:
        """Counted locally when the server reports no usage (provider numbers are preferred)."""
        counter = self.token_counter
        produced = text + "".join(c.name + c.arguments_json for c in calls)
        return Usage(count_chat_tokens(counter, request.messages, request.tools), counter.count(produced))


def _pool(connections: ModelConnections) -> httpx2.Limits:
    """The SDK transport's pool: every connection may be kept alive (a burst of answers that
    end together leaves its connections for the next calls, not for a new TCP handshake each)."""
    n = connections.max_connections
    return httpx2.Limits(
        max_connections=n, max_keepalive_connections=n, keepalive_expiry=connections.keepalive_s
    )


class _StreamedError(Exception):
    """The server sent an error object as an event of the stream (after its 200)."""


_RESENDS_ON_CLOSE = 1


class _RateLimited(Exception):
    """A 429: the server did not take the request; ``wait_s`` is the reset its headers name."""

    def __init__(self, wait_s: float | None, error: ModelError, excerpt: str) -> None:
        super().__init__(str(error))
        self.wait_s = wait_s
        self.error = error
        self.excerpt = excerpt


_REQUEUES_ON_429 = 3
"""A call queued again after a 429 at most this often (each waits for the reset it was given)."""


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The data of each server-sent event (its ``data:`` lines joined), the last one even
    without the blank line that ends an event."""
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            yield "\n".join(data)
            data = []
    if data:
        yield "\n".join(data)


async def _chunks(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a chat-completions event stream, up to ``[DONE]``. The rest of the
    body is read too (there is normally none), so the connection goes back to the pool."""
    done = False
    async for event in _events(lines):
        done = done or event.startswith("[DONE]")
        if not done:
            yield _chunk(event)


def _chunk(event: str) -> dict[str, Any]:
    chunk = json.loads(event)
    if not isinstance(chunk, dict):
        raise ValueError(f"a stream event that is not a JSON object: {event[:80]!r}")
    error = chunk.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else None
        raise _StreamedError(str(message or error)[:EXCERPT_CHARS])
    return chunk
