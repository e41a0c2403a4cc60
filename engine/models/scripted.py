"""Deterministic models for tests, benchmarks and the offline demo.

``ScriptedModel`` replays a queue of responses; ``FunctionModel`` asks a function what to
answer given the request, like a real model reading the conversation. Neither is the product:
they exist so the engine's logic can be exercised without a paid API.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from typing import Any, AsyncIterator, Callable, Iterable

from ..errors import ModelError
from ..events import ToolCallSpec
from .base import Model, ModelChunk, ModelRequest, ModelResponse, TextDelta, Usage, estimate_tokens

KEPT_REQUESTS = 256
"""How many of its latest requests a FunctionModel keeps for tests to read (``requests``)."""


def call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> ToolCallSpec:
    """A tool call for a script; dict arguments are JSON-encoded, strings passed through raw.

    Without ``call_id`` the id is derived from the name and arguments with SHA-256, so it is the
    same in every process (Python's ``hash`` of a string differs per process): a worker that
    takes over a turn after a crash asks the same question and gets the same call id. Two calls
    of one step with the same name and arguments need ids of their own."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    digest = hashlib.sha256(f"{name}\0{raw}".encode()).hexdigest()[:12]
    return ToolCallSpec(call_id or f"call_{name}_{digest}", name, raw)


def reply(text: str = "", *calls: ToolCallSpec) -> ModelResponse:
    """A model answer with ``text`` and the tool ``calls`` (made with ``call``), for scripted and
    function models."""
    return ModelResponse(text=text, tool_calls=tuple(calls), finish_reason="tool_calls" if calls else "stop")


class FunctionModel(Model):
    """Answers with ``fn(request)``: a ModelResponse, a string, or an exception to raise.

    ``fn`` runs on the event loop: keep it quick (a long computation blocks every session of the
    process). It sees the whole request, so it can answer like a model reading the conversation.
    The latest ``keep_requests`` requests stay readable in ``requests`` (oldest first; a worker
    that runs for days must not keep every request it was ever sent)."""

    def __init__(
        self,
        fn: Callable[[ModelRequest], ModelResponse | str],
        *,
        name: str = "function",
        chunk_chars: int = 0,
        keep_requests: int = KEPT_REQUESTS,
    ) -> None:
        self.fn = fn
        self.name = name
        self.chunk_chars = chunk_chars
        """If > 0, answer text is streamed in chunks of this many characters."""
        self.keep_requests = keep_requests
        self.requests: list[ModelRequest] = []
        self.calls = 0
        """Requests answered so far (``requests`` keeps only the latest)."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.calls += 1
        self.requests.append(request)
        if len(self.requests) > 2 * self.keep_requests:  # trimmed in bulk: amortised O(1) a call
            del self.requests[: len(self.requests) - self.keep_requests]
        answer = self.fn(request)
        response = answer if isinstance(answer, ModelResponse) else ModelResponse(text=answer)
        response = _stopped(response, request.stop)
        if self.chunk_chars and response.text:
            text = response.text
            for i in range(0, len(text), self.chunk_chars):
                yield TextDelta(text[i : i + self.chunk_chars])
        elif response.text:
            yield TextDelta(response.text)
        if response.usage == Usage():
            response = _with_estimated_usage(response, request)
        yield response


class ScriptedModel(FunctionModel):
    """Plays back responses in order; raises ModelError when the script runs out."""

    def __init__(
        self, responses: Iterable[ModelResponse | str | Exception], *, name: str = "scripted"
    ) -> None:
        self.script: deque[ModelResponse | str | Exception] = deque(responses)
        super().__init__(self._next, name=name)

    def _next(self, request: ModelRequest) -> ModelResponse | str:
        if not self.script:
            raise ModelError(f"{self.name}: script exhausted after {self.calls - 1} calls")
        item = self.script.popleft()
        if isinstance(item, Exception):
            raise item
        return item


def _stopped(response: ModelResponse, stop: tuple[str, ...]) -> ModelResponse:
    """The answer cut before the first stop text, as a server cuts it (finish_reason stop)."""
    cuts = [i for i in (response.text.find(s) for s in stop) if i >= 0]
    if not cuts:
        return response
    return ModelResponse(response.text[: min(cuts)], (), response.usage, "stop", response.model)


def _with_estimated_usage(response: ModelResponse, request: ModelRequest) -> ModelResponse:
    sent = sum(len(m.content) + sum(len(c.arguments_json) for c in m.tool_calls) for m in request.messages)
    written = response.text + "".join(c.name + c.arguments_json for c in response.tool_calls)
    usage = Usage(max(1, sent // 4), estimate_tokens(written))
    return ModelResponse(response.text, response.tool_calls, usage, response.finish_reason, response.model)
