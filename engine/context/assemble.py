"""What one model step is sent, section by section (seed §3.1).

    system prompt, task state            (system section)
    summary + earlier turns              (history)
    memories, recalled archive           (memory section, this turn only)
    the current user message             (input)
    this turn's tool traffic             (history)

The per-turn blocks stand right before the user message they were retrieved for, so the stable
part of the request (system prompt, older history) stays a cacheable prefix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..messages import ChatMessage
from . import task_state
from .compaction import current_input_index

if TYPE_CHECKING:
    from ..agent import Agent
    from ..fold import SessionState

MEMORY_HEADER = "What you remember about this user from earlier sessions:\n"
RECALL_HEADER = "Earlier in this session (brought back from the archive because the user refers to it):\n"


def turn_blocks(state: SessionState) -> list[ChatMessage]:
    """The memory section: this turn's memories and recalled messages, as system messages."""
    turn = state.turn
    if turn is None:
        return []
    blocks = []
    if turn.memories:
        blocks.append(ChatMessage.system(MEMORY_HEADER + turn.memories))
    if turn.recalled:
        blocks.append(ChatMessage.system(RECALL_HEADER + turn.recalled))
    return blocks


def system_blocks(state: SessionState, agent: Agent) -> list[ChatMessage]:
    blocks = [ChatMessage.system(agent.system_prompt)] if agent.system_prompt else []
    if agent.task_state is not None:
        blocks.append(
            ChatMessage.system(task_state.render(state.task_state or task_state.defaults(agent.task_state)))
        )
    return blocks


def assemble(state: SessionState, agent: Agent) -> list[ChatMessage]:
    """The messages of the next model step: system, history, per-turn blocks, input, this turn."""
    messages = system_blocks(state, agent)
    blocks = turn_blocks(state)
    if not blocks:
        messages += state.messages
        return messages
    current = current_input_index(state.messages, True)
    messages += state.messages[:current]
    messages += blocks
    messages += state.messages[current:]
    return messages
