"""The events of model calls: each call started and finished, the engine's own calls, fallbacks
to another model, corrections of what a model wrote, and the complete assistant message."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .envelope import Event
from .tools import ToolCallSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallStarted(Event):
    turn_id: str
    step: int
    """0-based index of the model call within its turn."""
    model: str
    message_count: int
    tools_offered: int
    estimated_input_tokens: int = 0
    """The request's size counted before sending it; 0 if the model gives no estimate."""
    section_tokens_json: str = "{}"
    """Tokens each context section used ({"system": .., "tools": .., "memory": .., "state": ..,
    "recall": .., "history": .., "input": ..}), counted with the model's tokenizer."""
    type: ClassVar[str] = "ModelCallStarted"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCallFinished(Event):
    turn_id: str
    step: int
    model: str
    status: str
    """"ok" or "failed"."""
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0
    retries: int = 0
    finish_reason: str = ""
    error: str | None = None
    cached_input_tokens: int = 0
    """Input tokens served from the provider's prompt cache (included in input_tokens)."""
    cost_micros: int = 0
    """Cost in micro-dollars by the agent's price table; 0 if the model is unpriced."""
    estimated: bool = False
    """The token counts (and so the cost) are the engine's, not the provider's usage: a call
    that was cancelled, interrupted or failed gets the request's size counted before sending
    and the tokens of the text streamed before it stopped (``status`` says which)."""
    type: ClassVar[str] = "ModelCallFinished"


@dataclass(frozen=True, slots=True, kw_only=True)
class AuxiliaryModelCall(Event):
    """A model call the engine made for its own work, not a step of the conversation: a context
    summary (inside a turn) or a memory extraction (after one), with what it used and cost.
    It counts in the session's (and its turn's) tokens, cost and budgets like a turn's calls."""

    turn_id: str
    """The turn it was made in or for ("" if none)."""
    purpose: str
    """summary | memory_extraction."""
    model: str
    status: str
    """ok | failed."""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_micros: int = 0
    latency_ms: float = 0.0
    estimated: bool = False
    """The counts are the engine's (the request counted before sending, the text streamed back),
    not the provider's usage."""
    error: str = ""
    type: ClassVar[str] = "AuxiliaryModelCall"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFallback(Event):
    turn_id: str
    step: int
    from_model: str
    to_model: str
    reason: str
    """Why the previous model was left: its error, or which time limit it hit."""
    degraded: bool = False
    """The next model is the rule-based responder: the user is told the service is degraded."""
    cause: str = "failed"
    """failed: the model failed or hit a time limit | breaker_open: its endpoint's circuit breaker
    is open, so the model was not called, or the call was handed over while it waited for its
    first token (engine.models.breaker)."""
    type: ClassVar[str] = "ModelFallback"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelBreakerChanged(Event):
    """A model endpoint's circuit breaker changed state in the process that wrote it (its
    ``producer``); recorded in the session of the call that caused the change: the failure that
    opened it, the oldest call that stalled, the probe that closed or reopened it."""

    turn_id: str
    step: int
    model: str
    endpoint: str
    """The endpoint's base URL (with ``model``'s provider name: the breaker's key)."""
    from_state: str
    to_state: str
    """closed | open | half_open."""
    reason: str
    type: ClassVar[str] = "ModelBreakerChanged"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCorrected(Event):
    """The engine corrected what a model wrote within one model step (engine.models.prompt_tools):
    the model was asked again with ``correction``, or, when that is empty, calls it repeated were
    only dropped. A dropped call is never run, whatever the model writes after."""

    turn_id: str
    step: int
    attempt: int
    """1-based: which of the step's answers this corrects."""
    kind: str
    """unreadable_call, repeated_call, other_tools, call_without_tools, no_answer (CorrectionKind)."""
    correction: str
    """The text the model was sent next; "" when nothing was sent."""
    model_text: str
    """What the model wrote (cut to 2,000 characters)."""
    dropped_calls_json: str = "[]"
    """JSON list of {"name", "arguments"}: calls that were not run and will not be."""
    type: ClassVar[str] = "ModelCorrected"


@dataclass(frozen=True, slots=True, kw_only=True)
class AssistantMessage(Event):
    """A complete model message; never a half-streamed one."""

    turn_id: str
    message_id: str
    text: str
    tool_calls: tuple[ToolCallSpec, ...] = ()
    type: ClassVar[str] = "AssistantMessage"
