"""Compaction never breaks a conversation (hypothesis): whatever the history, the cuts planned by
engine.context.compaction, applied by the fold, leave every tool call with its result, keep
the current user message and what follows it, and put a summary first."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context_support import provider_problems
from turnlog.engine import events as ev
from turnlog.engine.context import compaction
from turnlog.engine.fold import SessionState
from turnlog.engine.messages import SUMMARY_HEADER, ChatMessage, is_tool_error
from turnlog.engine.models.scripted import call

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


def reference_trim_candidates(
    messages: list[ChatMessage], counts: list[int], superseded: dict[str, str], end: int
) -> list[compaction.TrimItem]:
    """The candidates as the planner found them before TrimIndex: a full scan of the history
    (small talk forwards, spent results backwards), the oracle for the index."""
    items = []
    for i in range(min(end, len(messages)) - 1):
        user, answer = messages[i], messages[i + 1]
        if (
            user.role == "user"
            and answer.role == "assistant"
            and not answer.tool_calls
            and len(answer.content) <= compaction.SMALL_TALK_ANSWER_CHARS
            and compaction.is_small_talk(user.content)
        ):
            items.append(compaction.TrimItem(user.ref, "removed", "small_talk", counts[i]))
            items.append(compaction.TrimItem(answer.ref, "removed", "small_talk", counts[i + 1]))
    later_success: set[str] = set()
    spent = []
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role != "tool" or m.content.startswith(compaction.SPENT_PREFIX):
            continue
        name = m.name or ""
        if m.tool_call_id in superseded:
            by = superseded[m.tool_call_id]
            note = f"{compaction.SPENT_PREFIX} superseded by call {by}; the original is archived]"
            spent.append(compaction.TrimItem(m.ref, "shortened", "superseded", counts[i], note))
        elif is_tool_error(m) and name in later_success:
            later = f"a later {name} call"
            note = (
                f"{compaction.SPENT_PREFIX} failed attempt, corrected by {later}; the original is archived]"
            )
            spent.append(compaction.TrimItem(m.ref, "shortened", "corrected_error", counts[i], note))
        elif not is_tool_error(m):
            later_success.add(name)
    spent.reverse()
    return items + [s for s in spent if s.tokens > max(1, len(s.text) // 4) + 4]


MESSAGE = st.one_of(
    st.tuples(st.just("user"), st.sampled_from(["thanks!", "hello", "Check order A-1", "ok"])),
    st.tuples(st.just("assistant"), st.sampled_from(["Done.", "You're welcome.", "x" * 500])),
    st.tuples(
        st.just("tool"),
        st.sampled_from(["found it " * 20, "[FAILED] not found " * 5, "[REJECTED] no", "[context: cut]"]),
        st.sampled_from(["lookup", "refund", None]),
        st.sampled_from(["c1", "c2", "c3", "c4", None]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(MESSAGE, max_size=40),
    st.lists(st.sampled_from(["c1", "c2", "c3", "c4"]), max_size=3),
    st.lists(st.integers(0, 40), max_size=6),
)
def test_the_trim_index_finds_what_a_full_scan_finds_as_the_history_grows(
    specs: list[tuple[str, ...]], superseded_ids: list[str], stops: list[int]
) -> None:
    """The index kept across calls (read once per message) plans exactly what a scan of the
    whole history did, at every length the history passes through, for any superseded calls."""
    messages: list[ChatMessage] = []
    index = compaction.TrimIndex()
    superseded = {call_id: f"later-{call_id}" for call_id in superseded_ids}
    checkpoints = sorted({*stops, len(specs)})
    for n, spec in enumerate(specs, start=1):
        role, content, *tool = spec
        if role == "tool":
            name, call_id = tool
            messages.append(ChatMessage("tool", content, tool_call_id=call_id, name=name, ref=n))
        elif role == "assistant" and n % 3 == 0:
            messages.append(ChatMessage("assistant", content, (call("lookup", {"n": n}, f"c{n}"),), ref=n))
        else:
            messages.append(ChatMessage(role, content, ref=n))
        if n not in checkpoints:
            continue
        counts = [len(m.content) // 4 + 3 for m in messages]
        for end in (len(messages), max(0, len(messages) - 2)):
            index.update(messages)
            found = index.small_talk_items(messages, counts, end) + index.spent_items(
                messages, counts, superseded
            )
            assert found == reference_trim_candidates(messages, counts, superseded, end)
    rewritten = [
        ChatMessage(m.role, m.content, m.tool_calls, m.tool_call_id, m.name, m.ref) for m in messages[1:]
    ]
    counts = [len(m.content) // 4 + 3 for m in rewritten]
    index.update(rewritten)  # a compaction's new list is indexed afresh
    found = index.small_talk_items(rewritten, counts, len(rewritten)) + index.spent_items(
        rewritten, counts, {}
    )
    assert found == reference_trim_candidates(rewritten, counts, {}, len(rewritten))
