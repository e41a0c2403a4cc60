"""Provider-neutral chat messages: what the fold keeps as history and models are sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .events import ToolCallSpec

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str
    tool_calls: tuple[ToolCallSpec, ...] = ()
    """Set on assistant messages that ask for tools."""
    tool_call_id: str | None = None
    """Set on tool messages: the call this is the result of."""
    name: str | None = None
    """Tool name on tool messages."""

    @staticmethod
    def system(text: str) -> ChatMessage:
        return ChatMessage("system", text)

    @staticmethod
    def user(text: str) -> ChatMessage:
        return ChatMessage("user", text)


def turn_tool_results(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The tool results after the last user message: what the current turn has gathered.

    Scans back from the end, so its cost is the current turn's length, not the history's.
    """
    results: list[ChatMessage] = []
    for message in reversed(messages):
        if message.role == "user":
            break
        if message.role == "tool":
            results.append(message)
    results.reverse()
    return results
