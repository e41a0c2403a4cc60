"""Chat message helpers."""

from __future__ import annotations

from turnlog.engine.messages import ChatMessage, turn_tool_results


def tool(content: str) -> ChatMessage:
    return ChatMessage("tool", content, tool_call_id=content)


def test_turn_tool_results_are_the_tool_messages_after_the_last_user_message() -> None:
    history = [
        ChatMessage.user("first"),
        ChatMessage("assistant", ""),
        tool("old"),
        ChatMessage("assistant", "answer"),
        ChatMessage.user("second"),
        ChatMessage("assistant", ""),
        tool("a"),
        tool("b"),
        ChatMessage("assistant", ""),
        tool("c"),
    ]
    assert [m.content for m in turn_tool_results(history)] == ["a", "b", "c"]
    assert turn_tool_results(history[:5]) == []
    assert turn_tool_results([]) == []
