"""Compaction never breaks a conversation (hypothesis): whatever the history, the cuts planned by
engine.context.compaction, applied by the fold, leave every tool call with its result, keep
the current user message and what follows it, and put a summary first."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import events as ev
from engine.context import compaction
from engine.fold import SessionState
from engine.messages import SUMMARY_HEADER, ChatMessage
from engine.models.scripted import call
from tests.context_support import provider_problems

EXCHANGE = st.tuples(
    st.sampled_from(["thanks!", "hello", "Check order A-1", "What is late this week?"]),
    st.lists(st.lists(st.sampled_from(["ok", "big", "failed"]), min_size=1, max_size=3), max_size=3),
)


def history(exchanges: list[tuple[str, list[list[str]]]]) -> list[ChatMessage]:
    """User message, then tool batches (assistant calls + results), then a plain answer."""
    messages: list[ChatMessage] = []
    for n, (text, batches) in enumerate(exchanges):
        messages.append(ChatMessage("user", text, ref=len(messages) + 1))
        for b, batch in enumerate(batches):
            calls = tuple(call("lookup", {"i": f"{n}.{b}.{k}"}, f"c{n}.{b}.{k}") for k in range(len(batch)))
            messages.append(ChatMessage("assistant", "", calls, ref=len(messages) + 1))
            for spec, kind in zip(calls, batch, strict=True):
                content = {"ok": "found it", "big": "x" * 4000, "failed": "[FAILED] not found"}[kind]
                messages.append(
                    ChatMessage(
                        "tool", content, tool_call_id=spec.call_id, name="lookup", ref=len(messages) + 1
                    )
                )
        messages.append(
            ChatMessage("assistant", "You're welcome." if n % 2 else "Done.", ref=len(messages) + 1)
        )
    return messages[:-1]  # the last exchange is the running turn: no answer yet


def apply(state: SessionState, event_cls: type[ev.Event], **fields: object) -> None:
    state.apply(event_cls(session_id=state.session_id, version=state.version + 1, **fields))  # type: ignore[call-arg]


@settings(max_examples=150, deadline=None)
@given(st.lists(EXCHANGE, min_size=1, max_size=8), st.integers(10, 3000), st.booleans())
def test_compaction_keeps_calls_with_results_and_the_current_turn(
    exchanges: list[tuple[str, list[list[str]]]], budget: int, superseded_first: bool
) -> None:
    messages = history(exchanges)
    state = SessionState("s", version=len(messages) + 1, messages=list(messages))
    if superseded_first and any(m.role == "tool" for m in messages):
        first = next(m for m in messages if m.role == "tool")
        state.superseded[first.tool_call_id or ""] = "later"
    counts = [len(m.content) // 4 + 3 for m in state.messages]
    current = compaction.current_input_index(state.messages, True)
    current_turn = state.messages[current:]
    total = sum(counts) - counts[current]

    trims = compaction.plan_trim(
        state.messages, counts, state.superseded, total=total, target=budget // 2, protected_from=current
    )
    if trims:
        items = [
            {"ref": i.ref, "action": i.action, "reason": i.reason, "tokens": i.tokens, "text": i.text}
            for i in trims
        ]
        apply(state, ev.ContextTrimmed, turn_id="t", step=0, items_json=json.dumps(items),
              history_tokens_before=total, history_tokens_after=0, history_budget=budget)  # fmt: skip
    counts = [len(m.content) // 4 + 3 for m in state.messages]
    current = compaction.current_input_index(state.messages, True)
    cut = compaction.summary_cut(state.messages, counts, protected_from=current, target=budget // 3)
    if cut:
        refs = [m.ref for m in state.messages[:cut]]
        apply(state, ev.HistorySummarized, turn_id="t", step=0, removed_refs_json=json.dumps(refs),
              summary="s", summarizer="extractive", reason="tokens")  # fmt: skip
        assert state.messages[0].content.startswith(SUMMARY_HEADER)
    counts = [len(m.content) // 4 + 3 for m in state.messages]
    oversized = compaction.plan_oversized(
        state.messages, counts, total=sum(counts), target=budget, max_tokens=200
    )
    if oversized:
        items = [
            {"ref": i.ref, "action": i.action, "reason": i.reason, "tokens": i.tokens, "text": i.text}
            for i in oversized
        ]
        apply(state, ev.ContextTrimmed, turn_id="t", step=0, items_json=json.dumps(items),
              history_tokens_before=0, history_tokens_after=0, history_budget=budget)  # fmt: skip

    assert provider_problems(state.messages) == []
    now = compaction.current_input_index(state.messages, True)
    assert [(m.role, m.ref, m.tool_call_id) for m in state.messages[now:]] == [
        (m.role, m.ref, m.tool_call_id) for m in current_turn
    ]
    assert state.messages[now].content == current_turn[0].content  # the user's message is never cut
