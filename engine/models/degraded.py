"""The last link of a fallback chain: a rule-based responder (seed §8).

When both the agent's model and its backup fail, the session still answers. Intent patterns,
configured per agent, map a recognised request to a canned answer or to one tool call whose
result is then returned as it is. Every answer says plainly that the service is degraded, so the
user knows this is not the assistant's usual answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from ..messages import ChatMessage, turn_tool_results
from .base import Model, ModelChunk, ModelRequest, ModelResponse, TextDelta
from .scripted import call

DEGRADED_NOTICE = "The assistant is running in a degraded mode right now, so this is an automatic answer."
DEFAULT_ANSWER = "I cannot handle this request right now. Please try again in a few minutes."


@dataclass(frozen=True, slots=True)
class Intent:
    """A recognised request: a regular expression on the user's message, and what to do."""

    pattern: str
    answer: str = ""
    """The canned answer; with a tool, the text put before the tool's result."""
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text, re.IGNORECASE) is not None


class RuleBasedResponder(Model):
    """Answers from intent rules; never fails, never calls more than one tool per turn."""

    def __init__(self, intents: Sequence[Intent] = (), *, fallback_answer: str = DEFAULT_ANSWER) -> None:
        self.name = "degraded-rules"
        self.intents = list(intents)
        self.fallback_answer = fallback_answer

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        response = self._respond(request)
        if response.text:
            yield TextDelta(response.text)
        yield response

    def _respond(self, request: ModelRequest) -> ModelResponse:
        question = _last_user_text(request.messages)
        results = turn_tool_results(request.messages)
        intent = next((i for i in self.intents if i.matches(question)), None)
        offered = {str(spec["name"]) for spec in request.tools}
        if intent is not None and intent.tool and not results and intent.tool in offered:
            return ModelResponse("", (call(intent.tool, json.dumps(intent.arguments)),), model=self.name)
        if intent is not None and intent.tool and results:
            body = "\n".join(r.content for r in results)
            return self._answer(f"{intent.answer}\n{body}".strip())
        return self._answer(intent.answer if intent and intent.answer else self.fallback_answer)

    def _answer(self, text: str) -> ModelResponse:
        return ModelResponse(f"{DEGRADED_NOTICE}\n\n{text}", model=self.name)


def _last_user_text(messages: Sequence[ChatMessage]) -> str:
    return next((m.content for m in reversed(messages) if m.role == "user"), "")
