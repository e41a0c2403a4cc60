"""Provider-neutral chat messages: what the fold keeps as history and models are sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from .events import ToolCallSpec

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One entry of a conversation as a model sees it, whatever the provider: system, user,
    assistant (with the tool calls it asked for) or tool (a call's result)."""

    role: Role
    content: str
    tool_calls: tuple[ToolCallSpec, ...] = ()
    """Set on assistant messages that ask for tools."""
    tool_call_id: str | None = None
    """Set on tool messages: the call this is the result of."""
    name: str | None = None
    """Tool name on tool messages."""
    ref: int = field(default=0, compare=False)
    """The version of the event this message came from (UserMessageReceived, AssistantMessage,
    ToolCallFinished, HistorySummarized): how context management names what it cut, and where
    the original is on the log. 0 for messages that are not in the session's history."""

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


SUMMARY_HEADER = (
    "Summary of the earlier conversation (the original messages are archived; "
    "recall_history searches them):\n"
)


def summary_message(summary: str, ref: int) -> ChatMessage:
    """The one message a history summary stands as, in front of the history."""
    return ChatMessage("system", SUMMARY_HEADER + summary, ref=ref)


def calls_text(calls: Sequence[ToolCallSpec]) -> str:
    """Tool calls as one line of text, ``name(arguments); ...`` (summaries, the archive)."""
    return "; ".join(f"{c.name}({c.arguments_json})" for c in calls)


def is_tool_error(message: ChatMessage) -> bool:
    """A tool result that reports a failure (every non-success result starts with a marker)."""
    return message.role == "tool" and message.content.startswith(("[FAILED", "[REJECTED]"))


def grew_at_end(
    messages: Sequence[ChatMessage], known: Sequence[ChatMessage] | None, count: int, last: ChatMessage | None
) -> bool:
    """Whether ``messages`` is the list ``known`` that held ``count`` messages ending in
    ``last``, grown only at its end since. The fold appends to a session's history list and
    replaces the list whenever it rewrites history (a compaction), and a reload makes a new one,
    so a cache over the list (encoded messages, trim candidates) is extended while this holds
    and rebuilt when it does not."""
    return messages is known and len(messages) >= count and (not count or messages[count - 1] is last)
