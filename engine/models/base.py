"""The model interface: one async streaming method.

A model turns a ModelRequest into a stream of ModelChunks: any number of TextDelta (and, from a
fallback chain, ModelSwitch and BreakerChange; from a wrapper that corrects the model,
ModelCorrection; from an endpoint's client-side limiter, EndpointWait), then exactly one
ModelResponse (the complete message). Only the ModelResponse is ever written to history; a
stream that breaks before it is a failed call and leaves no trace in the conversation.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, AsyncIterator, Sequence

from ..events import ToolCallSpec
from ..messages import ChatMessage
from .breaker import BreakerChange
from .tokens import shared_counter

if TYPE_CHECKING:
    from .endpoints import Endpoint, Endpoints
    from .tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What a model is asked: the messages, the tools it may call and the call's limits."""

    messages: Sequence[ChatMessage]
    """System prompt first (if any), then history."""
    tools: Sequence[dict[str, Any]] = ()
    """Tool specs {name, description, parameters}; empty = the model must answer in text."""
    session_id: str = ""
    turn_id: str = ""
    stop: tuple[str, ...] = ()
    """Texts at which the model stops writing (OpenAI's ``stop``, at most 4); the answer ends
    before the first one. Empty: none."""
    max_output_tokens: int | None = None
    """A tighter cap on this answer's length than the model's own, if any."""
    endpoints: Endpoints | None = field(default=None, compare=False, repr=False)
    """The process's per-endpoint state (breakers, client-side limits), shared by every call the
    process makes; the turn runner that owns it sets it. None: a model keeps a registry of its own."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a model call used, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    """Part of input_tokens the provider served from its prompt cache (billed at its own rate)."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
        )


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Answer text as it streams. An empty delta is a heartbeat: the model is producing output
    that is not answer text (a tool call being written); it counts as the first token and is not
    streamed to the user."""

    text: str


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """A model's whole answer: its text, the tool calls it asked for, and what it used."""

    text: str
    tool_calls: tuple[ToolCallSpec, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"
    model: str = ""


@dataclass(frozen=True, slots=True)
class ModelSwitch:
    """A model failed and the next one in the fallback chain takes over (recorded as an event)."""

    from_model: str
    to_model: str
    reason: str
    degraded: bool = False
    """The next model is the rule-based responder."""
    cause: str = "failed"
    """``failed``: the model failed or hit a time limit; ``breaker_open``: its endpoint's breaker
    is open (the model was not called, or the call was handed over while it waited)."""


@dataclass(frozen=True, slots=True)
class EndpointWait:
    """The call waits for its endpoint before its request goes out (client-side limits, a 429's
    reset): ``over`` once the wait ends and the request is sent. Never a first token."""

    model: str
    reason: str
    ahead: int = 0
    """Calls queued before this one."""
    over: bool = False


class CorrectionKind(StrEnum):
    UNREADABLE_CALL = "unreadable_call"
    """A tool call that could not be read: the model is sent the parse error."""
    REPEATED_CALL = "repeated_call"
    """Calls already made in this turn: dropped (never run), and the model asked to go on."""
    OTHER_TOOLS = "other_tools"
    """Calls of other tools than the answer's first: dropped (the model calls them again later)."""
    CALL_WITHOUT_TOOLS = "call_without_tools"
    """A tool call when none is offered: the model is asked to answer in plain text."""
    NO_ANSWER = "no_answer"
    """No answer text at all when one was asked for."""


@dataclass(frozen=True, slots=True)
class ModelCorrection:
    """A wrapper corrected what the model wrote within one call (recorded as a ModelCorrected
    event): it sent ``correction`` and asked again, or (``correction`` empty) only dropped calls."""

    attempt: int
    kind: CorrectionKind
    correction: str
    model_text: str
    dropped: tuple[ToolCallSpec, ...] = ()


ModelChunk = TextDelta | ModelSwitch | BreakerChange | EndpointWait | ModelCorrection | ModelResponse


class Model(abc.ABC):
    """Implement ``stream``; the engine handles timeouts, history and events."""

    name: str = "model"
    first_token_timeout_s: float | None = None
    """This model's own time-to-first-token limit; None uses the agent's (seed §5.3)."""
    response_timeout_s: float | None = None
    """This model's own total-response limit; None uses the agent's."""
    context_window: int | None = None
    """Tokens the model accepts in one request, if known; a fallback refits the request to it."""
    timeout_hint: str = ""
    """What to do when a call of this model runs out of time (added to the timeout's message)."""

    @property
    def endpoint(self) -> Endpoint | None:
        """Where this model's calls go, with the limits and breaker settings there; None for a
        model that calls no endpoint (scripted, rule-based): no breaker then."""
        return None

    @abc.abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """Yield TextDelta chunks, then one ModelResponse."""

    async def aclose(self) -> None:
        """Release connections; the default has none."""
        return None

    def model_for(self, request: ModelRequest) -> str:
        """The name of the model that will answer ``request`` (a router decides per session)."""
        return self.name

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        """The request's size in this model's tokens, counted before it is sent (for budgets and
        the trace). 0 means no estimate: the default, so scripted models cost nothing here."""
        return 0

    @property
    def token_counter(self) -> TokenCounter:
        """The tokenizer context budgets count with: tiktoken's cl100k_base unless the model has
        its own (an OpenAI model's encoding, a local model's server tokenizer)."""
        return shared_counter("cl100k_base")


def estimate_tokens(text: str) -> int:
    """A rough count (4 characters a token) for models that report no usage."""
    return max(1, len(text) // 4) if text else 0
