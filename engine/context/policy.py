"""How much of a model's window each part of the context may take (seed §3.1).

For a 128K window: the system prompt and tools 8K, long-term memory and recalled history 4K,
the current input and the reserved reply 16K, the history 64K; the rest is a safety buffer
for the tokenizer's error and the provider's framing. Other windows scale the same shares.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigurationError
from ..models.base import Model

REFERENCE_WINDOW = 128_000
DEFAULT_WINDOW = REFERENCE_WINDOW
"""The window assumed for a model that does not say its own."""


@dataclass(frozen=True, slots=True)
class SectionBudgets:
    """Token budgets of one model's context, by section."""

    window: int
    system: int
    """The system prompt, the tool definitions and the task state."""
    memory: int
    """Long-term memories and archived messages recalled for this turn."""
    input: int
    """The current user message and the reply the model is left room for."""
    history: int
    """Everything else of the conversation: earlier turns, this turn's tool traffic."""

    @property
    def buffer(self) -> int:
        return self.window - self.system - self.memory - self.input - self.history


@dataclass(frozen=True)
class ContextPolicy:
    """An agent's context management. The defaults follow seed §3.1-§3.2."""

    window: int | None = None
    """Tokens the model accepts; None takes the model's ``context_window``, else 128K."""
    system_share: float = 8 / 128
    memory_share: float = 4 / 128
    input_share: float = 16 / 128
    history_share: float = 64 / 128
    trim_at: float = 0.6
    """Share of the history budget at which the lowest-value messages are cut."""
    summarize_at: float = 0.9
    """Share of the history budget at which the oldest exchanges are summarised."""
    summarize_to: float = 0.5
    """Share of the history budget a summary cuts the history down to (the summary included).
    The summariser then runs again only after the history grows back by ``summarize_at -
    summarize_to`` of its budget: every ``(summarize_at - summarize_to) * history budget /
    tokens a turn adds`` turns in a steady conversation (docs/architecture.md, bench §9)."""
    summarizer: Model | str | None = None
    """The model that writes summaries (typically a cheaper one); None uses the agent's model;
    ``"extractive"`` picks lines by rule, no model."""
    verbatim_turns: int | None = None
    """Earlier turns kept word for word; older ones are summarised (second seed §5.1)."""
    max_result_share: float = 0.25
    """Largest share of the history budget one tool result may keep when the history overflows."""

    def __post_init__(self) -> None:
        shares = self.system_share + self.memory_share + self.input_share + self.history_share
        if not 0 < shares <= 1:
            raise ConfigurationError(f"context shares add up to {shares:.2f}; they must be in (0, 1]")
        if not 0 < self.trim_at <= self.summarize_at <= 1:
            raise ConfigurationError("context thresholds need 0 < trim_at <= summarize_at <= 1")
        if not 0 < self.summarize_to < self.summarize_at:
            raise ConfigurationError("summarize_to must be above 0 and below summarize_at")
        if self.verbatim_turns is not None and self.verbatim_turns < 1:
            raise ConfigurationError("verbatim_turns must be at least 1 (or None for no limit)")
        if isinstance(self.summarizer, str) and self.summarizer != "extractive":
            raise ConfigurationError(
                f"summarizer must be a Model, None or 'extractive', not {self.summarizer!r}"
            )
        if self.window is not None and self.window < 1024:
            raise ConfigurationError(f"a context window of {self.window} tokens is too small to work in")

    def budgets(self, model: Model) -> SectionBudgets:
        window = self.window or model.context_window or DEFAULT_WINDOW
        return SectionBudgets(
            window,
            int(window * self.system_share),
            int(window * self.memory_share),
            int(window * self.input_share),
            int(window * self.history_share),
        )
