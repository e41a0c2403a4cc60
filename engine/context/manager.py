"""The turn loop's hands on the context: keep each model step within its budgets (seed §3).

``start_turn`` adds what a new turn is told beyond the history (the user's memories, archived
messages the user refers back to). ``fit`` runs before every model call: trim at 60 % of the
history budget, summarise the oldest exchanges at 90 % (or past the verbatim-turn limit) down to
``summarize_to`` (50 %) with the summary, and cut oversized tool results if the history still
does not fit. Every change is an event added to
the step's batch, so the log shows what each call was sent and why anything was left out.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .. import events as ev
from .. import usage
from ..log.base import EventLog
from ..messages import SUMMARY_HEADER, summary_message
from ..models.base import Model, ModelRequest
from ..models.endpoints import Endpoints
from ..session_cache import ENTRY_BYTES, Kind, SessionCache
from ..tools import ToolRegistry
from . import archive, builtins, compaction, memory
from .assemble import system_blocks, turn_blocks
from .summarize import summarize
from .tally import COUNT_BYTES, TokenTally, message_tokens, within_budget

SUMMARY_SHARE = 8
"""A summary takes at most 1/8 of the history budget."""

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


TRIM_INDEX: Kind[compaction.TrimIndex] = Kind("trim index")
"""A session's trim candidates, in the runner's ``SessionCache``."""


class ContextManager:
    def __init__(
        self, log: EventLog, cache: SessionCache | None = None, endpoints: Endpoints | None = None
    ) -> None:
        """``cache``: the runner's, for the token tally and the trim indexes (None: one of its own)."""
        self.log = log
        self.endpoints = endpoints
        """The process's model endpoints, for the summariser's calls."""
        self._cache = cache if cache is not None else SessionCache()
        self.tally = TokenTally(self._cache)
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
            index=self._trim_index(w.state.session_id),
        )
        return self._add_trim(w, step, items, size, budget, agent)

    def _trim_index(self, session_id: str) -> compaction.TrimIndex:
        """The session's trim candidates, read once per message (in the runner's cache)."""
        index = self._cache.get(session_id, TRIM_INDEX) or compaction.TrimIndex()
        self._cache.put(session_id, TRIM_INDEX, index, ENTRY_BYTES + COUNT_BYTES * index.seen)
        return index

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
        room = budget // SUMMARY_SHARE  # what the summary itself may take
        cut = compaction.summary_cut(
            w.state.messages,
            size.counts,
            protected_from=size.current,
            # at the threshold: down to summarize_to of the budget; forced (a cost budget, the
            # provider's length limit): down to that share of what the history holds now
            target=self._earlier_target(
                w.state, size, budget if reason in ("tokens", "turns") else size.tokens, policy.summarize_to
            ),
            # the provider measured it too long: keep only the last exchange word for word
            keep_turns=1 if reason == "context_length" else policy.verbatim_turns,
        )
        if cut == 0:
            return False
        removed = w.state.messages[:cut]
        summary = await summarize(
            _summarizer(agent),
            removed,
            max_chars=room * 4,  # about 4 characters a token
            first_token_s=agent.first_token_timeout_s,
            response_s=agent.model_timeout_s,
            endpoints=self.endpoints,
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
        if summary.call is not None:  # the summariser's call counts like any (tokens, cost, budgets)
            made = summary.call
            if made.usage is not None:
                spent = usage.priced(agent.prices, [made.model], made.usage)
            else:
                counter = agent.model.token_counter
                spent = usage.unanswered(agent.prices, made.model, made.sent_tokens, made.streamed, counter)
            usage.add_auxiliary_call(w, turn_id, "summary", made.model, spent, made.latency_ms, made.error)
        return True

    @staticmethod
    def _earlier_target(state: SessionState, size: HistorySize, budget: int, share: float) -> int:
        """Tokens the earlier turns may keep so that, with the new summary and this turn's own
        calls and results (never cut), the history is at most ``share`` of its budget. The new
        summary is taken to be as large as the one it replaces (it restates it; capped at 1/8
        of the budget), or 1/8 of the budget for a first summary."""
        earlier = sum(size.counts[: size.current])
        this_turn = size.tokens - earlier
        first = state.messages[0] if state.messages else None
        is_summary = first is not None and first.role == "system" and first.content.startswith(SUMMARY_HEADER)
        summary = size.counts[0] if is_summary else budget // SUMMARY_SHARE
        return max(0, int(share * budget) - this_turn - summary)

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
