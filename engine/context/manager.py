"""The turn loop's hands on the context: keep each model step within its budgets (seed §3).

``start_turn`` adds what a new turn is told beyond the history (the user's memories, archived
messages the user refers back to). ``fit`` runs before every model call: trim at 60 % of the
history budget, summarise the oldest third at 90 % (or past the verbatim-turn limit), and cut
oversized tool results if the history still does not fit. Every change is an event added to
the step's batch, so the log shows what each call was sent and why anything was left out.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .. import events as ev
from ..log.base import EventLog
from ..messages import summary_message
from ..models.base import Model, ModelRequest
from ..tools import ToolRegistry
from . import archive, builtins, compaction, memory
from .assemble import system_blocks, turn_blocks
from .summarize import summarize
from .tally import TokenTally, message_tokens, within_budget

if TYPE_CHECKING:
    from ..agent import Agent
    from ..fold import SessionState
    from ..writer import SessionWriter


@dataclass(frozen=True, slots=True)
class HistorySize:
    counts: Sequence[int]
    current: int
    """Index of the current user message (len(messages) between turns)."""
    tokens: int
    """Tokens of the history: every message but the current user message."""


class ContextManager:
    def __init__(self, log: EventLog, cache_size: int = 1024) -> None:
        self.log = log
        self.tally = TokenTally(cache_size)
        self._tool_tokens: weakref.WeakKeyDictionary[ToolRegistry, int] = weakref.WeakKeyDictionary()

    def measure(self, state: SessionState, agent: Agent) -> HistorySize:
        counts, total = self.tally.counts(state.session_id, state.messages, agent.model.token_counter)
        current = compaction.current_input_index(state.messages, state.turn is not None)
        if current < len(counts):
            total -= counts[current]
        return HistorySize(counts, current, total)

    async def start_turn(self, w: SessionWriter, agent: Agent) -> None:
        """Memories for the new turn's message and, if it refers back, what it refers to."""
        state, turn = w.state, w.state.turn
        assert turn is not None
        text = state.messages[-1].content
        budgets = agent.context.budgets(agent.model)
        counter = agent.model.token_counter
        if agent.memory is not None:
            found = await memory.retrieve(agent.memory, state.user_id, text)
            kept, tokens = within_budget(found, lambda m: counter.count(m.text) + 6, budgets.memory // 2)
            if kept:
                w.add(
                    ev.MemoriesRetrieved,
                    turn_id=turn.turn_id,
                    query=text[:2000],
                    memories_json=memory.memories_json(kept),
                    tokens=tokens,
                    correlation_id=turn.turn_id,
                )
        if state.archived and archive.refers_back(text):
            found_messages = archive.recall_for(await archive.load_archive(self.log, state.session_id), text)
            lines = [m.quoted() for m in found_messages]
            quoted, _ = within_budget(lines, lambda line: counter.count(line) + 2, budgets.memory // 2)
            if quoted:
                w.add(
                    ev.HistoryRecalled,
                    turn_id=turn.turn_id,
                    query=text[:2000],
                    refs_json=json.dumps([m.ref for m in found_messages[: len(quoted)]]),
                    text="\n".join(quoted),
                    correlation_id=turn.turn_id,
                )

    async def fit(self, w: SessionWriter, agent: Agent, step: int, *, force: str = "") -> bool:
        """Bring the history within its budget before model step ``step``. ``force`` (a reason:
        context_length, budget) summarises even below the threshold. True if anything changed."""
        policy = agent.context
        budget = policy.budgets(agent.model).history
        size = self.measure(w.state, agent)
        changed = False
        if size.tokens >= policy.trim_at * budget:
            changed |= self._trim(w, agent, step, size, budget, int(policy.trim_at * budget))
            size = self.measure(w.state, agent)
        reason = force or self._summary_reason(agent, w.state, size, budget)
        if reason:
            changed |= await self._summarize(w, agent, step, size, reason, budget)
            size = self.measure(w.state, agent)
        if size.tokens > budget:
            items = compaction.plan_oversized(
                w.state.messages,
                size.counts,
                total=size.tokens,
                target=budget,
                max_tokens=int(budget * policy.max_result_share),
            )
            changed |= self._add_trim(w, step, items, size, budget, agent)
        return changed

    def _summary_reason(self, agent: Agent, state: SessionState, size: HistorySize, budget: int) -> str:
        if size.tokens >= agent.context.summarize_at * budget:
            return "tokens"
        keep = agent.context.verbatim_turns
        if keep is not None:
            earlier = sum(1 for m in state.messages[: size.current] if m.role == "user")
            if earlier > keep:
                return "turns"
        return ""

    def _trim(
        self, w: SessionWriter, agent: Agent, step: int, size: HistorySize, budget: int, target: int
    ) -> bool:
        items = compaction.plan_trim(
            w.state.messages,
            size.counts,
            w.state.superseded,
            total=size.tokens,
            target=target,
            protected_from=size.current,
        )
        return self._add_trim(w, step, items, size, budget, agent)

    def _add_trim(
        self,
        w: SessionWriter,
        step: int,
        items: list[compaction.TrimItem],
        size: HistorySize,
        budget: int,
        agent: Agent,
    ) -> bool:
        if not items:
            return False
        turn_id = w.state.turn.turn_id if w.state.turn else ""
        counter = agent.model.token_counter
        after = (
            size.tokens - sum(i.tokens for i in items) + sum(counter.count(i.text) for i in items if i.text)
        )
        w.add(
            ev.ContextTrimmed,
            turn_id=turn_id,
            step=step,
            items_json=json.dumps(
                [
                    {"ref": i.ref, "action": i.action, "reason": i.reason, "tokens": i.tokens, "text": i.text}
                    for i in items
                ],
                ensure_ascii=False,
            ),
            history_tokens_before=size.tokens,
            history_tokens_after=max(0, after),
            history_budget=budget,
            correlation_id=turn_id or None,
        )
        return True

    async def _summarize(
        self, w: SessionWriter, agent: Agent, step: int, size: HistorySize, reason: str, budget: int
    ) -> bool:
        policy = agent.context
        cut = compaction.summary_cut(
            w.state.messages,
            size.counts,
            protected_from=size.current,
            # the provider measured it too long: keep only the last exchange word for word
            keep_turns=1 if reason == "context_length" else policy.verbatim_turns,
        )
        if cut == 0:
            return False
        removed = w.state.messages[:cut]
        summary = await summarize(
            _summarizer(agent),
            removed,
            max_chars=budget // 8 * 4,
            first_token_s=agent.first_token_timeout_s,
            response_s=agent.model_timeout_s,
        )
        turn_id = w.state.turn.turn_id if w.state.turn else ""
        summary_tokens = message_tokens(agent.model.token_counter, summary_message(summary.text, 0))
        w.add(
            ev.HistorySummarized,
            turn_id=turn_id,
            step=step,
            removed_refs_json=json.dumps([m.ref for m in removed]),
            summary=summary.text,
            summarizer=summary.summarizer,
            reason=reason,
            fallback=summary.fallback,
            error=summary.error,
            tokens_before=size.tokens,
            tokens_after=size.tokens - sum(size.counts[:cut]) + summary_tokens,
            correlation_id=turn_id or None,
        )
        return True

    def section_tokens(self, state: SessionState, agent: Agent, request: ModelRequest) -> dict[str, int]:
        """Tokens each section of ``request`` takes (recorded on ModelCallStarted)."""
        counter = agent.model.token_counter
        size = self.measure(state, agent)
        system, per_turn = system_blocks(state, agent), turn_blocks(state)
        sections: dict[str, Any] = {
            "system": sum(message_tokens(counter, m) for m in system),
            "tools": self._tools_tokens(builtins.session_tools(agent, state), counter)
            if request.tools
            else 0,
            "memory": sum(message_tokens(counter, m) for m in per_turn),
            "history": size.tokens,
            "input": size.counts[size.current] if size.current < len(size.counts) else 0,
        }
        extra = len(request.messages) - len(state.messages) - len(system) - len(per_turn)
        if extra > 0:  # a closing note after the history
            sections["system"] += sum(message_tokens(counter, m) for m in request.messages[-extra:])
        return sections

    def _tools_tokens(self, registry: ToolRegistry, counter: Any) -> int:
        """The tool definitions' tokens, counted once per registry (a session's tools are cached)."""
        tokens = self._tool_tokens.get(registry)
        if tokens is None:
            tokens = self._tool_tokens[registry] = counter.count(
                json.dumps(registry.specs(), ensure_ascii=False)
            )
        return tokens


def _summarizer(agent: Agent) -> Model | None:
    chosen = agent.context.summarizer
    if chosen == "extractive":
        return None
    return chosen if isinstance(chosen, Model) else agent.model
