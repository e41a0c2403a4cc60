"""What to cut from a history that grew too large (seed §3.2); pure, so it can be tested alone.

Three moves, cheapest loss first:

* ``plan_trim`` (at 60 % of the history budget): the lowest-value messages go first: oldest
  small talk (a greeting or a thanks and its answer, removed as a pair), then the details of tool
  calls that a later call superseded or whose error a later call corrected (the result is
  shortened to a note; the call and its result stay together).
* ``summary_cut`` (at 90 %, or past the agent's verbatim-turn limit): the oldest exchanges, as
  many as bring the rest of the history down to a target (``ContextPolicy.summarize_to``, half
  the history budget by default, less room for the summary), to be replaced by one summary
  message. Cutting well below the threshold, not just under it, is what keeps the summariser
  rare: the next summary waits until the history has grown back by the difference.
* ``plan_oversized`` (still over budget, e.g. huge tool results in the current turn): each tool
  result is cut down to a share of the budget, head kept, with a note.

Cuts never fall inside an exchange: a summary replaces everything before a user message, a
removal takes a user message with its plain answer, and shortening keeps every message. So a
tool call is never separated from its result, and what is sent stays a valid conversation.
Nothing is lost: each cut names its messages by ``ref``, and the originals stay on the log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from ..messages import ChatMessage, grew_at_end, is_tool_error

SMALL_TALK = re.compile(
    r"^\W*(hi|hello|hey|thanks?|thank you( very much)?|thx|ok(ay)?|cool|great|nice|good (morning|"
    r"afternoon|evening|night)|bye|see you|got it|sounds good|perfect|awesome|you'?re welcome|"
    r"你好|您好|谢谢|多谢|好的|好|嗯|早上好|晚上好|再见|收到|明白了?|没问题)\W*$",
    re.IGNORECASE,
)
SMALL_TALK_ANSWER_CHARS = 400
"""A plain answer longer than this is not small talk, whatever the user said."""


@dataclass(frozen=True, slots=True)
class TrimItem:
    ref: int
    action: str
    """removed | shortened"""
    reason: str
    """small_talk | superseded | corrected_error | oversized"""
    tokens: int
    """Tokens the message took before the cut."""
    text: str = ""
    """The shortened content (empty when removed)."""


def current_input_index(messages: Sequence[ChatMessage], turn_running: bool) -> int:
    """Index of the running turn's user message (what the model answers); len() when none."""
    if turn_running:
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].role == "user":
                return i
    return len(messages)


def is_small_talk(text: str) -> bool:
    return len(text) <= 60 and not any(c.isdigit() for c in text) and bool(SMALL_TALK.match(text))


def plan_trim(
    messages: Sequence[ChatMessage],
    counts: Sequence[int],
    superseded: dict[str, str],
    *,
    total: int,
    target: int,
    protected_from: int,
    index: TrimIndex | None = None,
) -> list[TrimItem]:
    """Cuts, lowest value first, until the history is at most ``target`` tokens (or nothing
    cheap is left). Small talk is only taken before ``protected_from`` (the current input).
    ``index``: the session's ``TrimIndex``, kept across calls so a call reads only the messages
    appended since the last (a fresh one when None)."""
    index = index if index is not None else TrimIndex()
    index.update(messages)
    items: list[TrimItem] = []
    for item in (
        *index.small_talk_items(messages, counts, protected_from),
        *index.spent_items(messages, counts, superseded),
    ):
        if total <= target:
            break
        items.append(item)
        total -= item.tokens - (_note_tokens(item) if item.action == "shortened" else 0)
    return items


def _note_tokens(item: TrimItem) -> int:
    return max(1, len(item.text) // 4)


@dataclass(slots=True)
class TrimIndex:
    """Where a history's trim candidates are, kept as messages are appended.

    Past ``trim_at`` of the budget every model call plans a trim; scanning the whole history
    each time made a call cost O(history) even when nothing could be cut (bench/README.md §3).
    The index reads each message once: small-talk pairs, failed and successful results by tool,
    and results by call id. A compaction or a reload makes a new message list, which is indexed
    afresh; ``superseded`` is looked up at each plan, since it grows on its own.
    """

    messages: Sequence[ChatMessage] | None = None
    seen: int = 0
    last: ChatMessage | None = None
    small_talk: list[int] = field(default_factory=list)
    """Index of each (user, plain answer) small-talk pair's user message, ascending."""
    failures: list[int] = field(default_factory=list)
    """Failed tool results, ascending."""
    successes: dict[str, list[int]] = field(default_factory=dict)
    """Successful tool results by tool name, ascending."""
    by_call: dict[str | None, list[int]] = field(default_factory=dict)
    """Tool results by call id."""

    def update(self, messages: Sequence[ChatMessage]) -> None:
        """Index the messages appended since the last call (all of them for a new list)."""
        n = self.seen
        if not grew_at_end(messages, self.messages, n, self.last):
            self.messages, n = messages, 0
            self.small_talk, self.failures, self.successes, self.by_call = [], [], {}, {}
        for j in range(n, len(messages)):
            m = messages[j]
            if j and _small_talk_pair(messages[j - 1], m):
                self.small_talk.append(j - 1)
            if m.role != "tool" or m.content.startswith(SPENT_PREFIX):
                continue  # a shortened result is never shortened again, nor counts as a success
            self.by_call.setdefault(m.tool_call_id, []).append(j)
            if is_tool_error(m):
                self.failures.append(j)
            else:
                self.successes.setdefault(m.name or "", []).append(j)
        self.seen = len(messages)
        self.last = messages[-1] if messages else None

    def small_talk_items(
        self, messages: Sequence[ChatMessage], counts: Sequence[int], end: int
    ) -> list[TrimItem]:
        """The small-talk pairs wholly before ``end``, oldest first, each as two removals."""
        limit = min(end, len(messages)) - 1
        items = []
        for i in self.small_talk:
            if i >= limit:
                break
            items.append(TrimItem(messages[i].ref, "removed", "small_talk", counts[i]))
            items.append(TrimItem(messages[i + 1].ref, "removed", "small_talk", counts[i + 1]))
        return items

    def spent_items(
        self, messages: Sequence[ChatMessage], counts: Sequence[int], superseded: dict[str, str]
    ) -> list[TrimItem]:
        """Tool results a later call replaced, oldest first: superseded ones, and failures a
        later (not superseded) successful call of the same tool got right."""
        marked = {i: by for call_id, by in superseded.items() for i in self.by_call.get(call_id, ())}
        corrected_before = {name: _newest_unmarked(found, marked) for name, found in self.successes.items()}
        corrected = [
            i
            for i in self.failures
            if i not in marked and i < corrected_before.get(messages[i].name or "", -1)
        ]
        items = []
        for i in sorted([*marked, *corrected]):
            m = messages[i]
            if i in marked:
                note = f"{SPENT_PREFIX} superseded by call {marked[i]}; the original is archived]"
                items.append(TrimItem(m.ref, "shortened", "superseded", counts[i], note))
            else:
                later = f"a later {m.name or ''} call"
                note = f"{SPENT_PREFIX} failed attempt, corrected by {later}; the original is archived]"
                items.append(TrimItem(m.ref, "shortened", "corrected_error", counts[i], note))
        return [item for item in items if item.tokens > _note_tokens(item) + 4]


def _small_talk_pair(user: ChatMessage, answer: ChatMessage) -> bool:
    return (
        user.role == "user"
        and answer.role == "assistant"
        and not answer.tool_calls
        and len(answer.content) <= SMALL_TALK_ANSWER_CHARS
        and is_small_talk(user.content)
    )


def _newest_unmarked(found: list[int], marked: dict[int, str]) -> int:
    """The newest of ``found`` not in ``marked`` (-1 if none)."""
    for i in reversed(found):
        if i not in marked:
            return i
    return -1


SPENT_PREFIX = "[context:"
"""Starts every note that stands in for a shortened result, so it is never shortened twice."""


def summary_cut(
    messages: Sequence[ChatMessage],
    counts: Sequence[int],
    *,
    protected_from: int,
    target: int,
    keep_turns: int | None = None,
) -> int:
    """How many leading messages to summarise: the fewest whole exchanges after which the rest
    of the history (before the current input) takes at most ``target`` tokens, or (with
    ``keep_turns``) all but that many earlier exchanges, whichever is more; always a whole
    number of exchanges (the cut is at a user message) and never into the current turn.
    0 means nothing can be summarised."""
    starts = [i for i in range(1, min(protected_from, len(messages)) + 1) if _starts_exchange(messages, i)]
    if not starts:
        return 0
    total = sum(counts[:protected_from]) if protected_from else sum(counts)
    cut, taken = 0, 0
    for i in starts:  # by tokens: the smallest cut that leaves at most the target
        taken = sum(counts[:i])
        cut = i
        if total - taken <= target:
            break
    if keep_turns is not None:
        users = [i for i in range(min(protected_from, len(messages))) if messages[i].role == "user"]
        if len(users) > keep_turns:
            cut = max(cut, users[len(users) - keep_turns])
    return cut


def _starts_exchange(messages: Sequence[ChatMessage], i: int) -> bool:
    return i == len(messages) or messages[i].role == "user"


def plan_oversized(
    messages: Sequence[ChatMessage], counts: Sequence[int], *, total: int, target: int, max_tokens: int
) -> list[TrimItem]:
    """Tool results cut to ``max_tokens`` (their head, with a note), largest first, until the
    history is at most ``target`` tokens."""
    order = sorted(
        (i for i, m in enumerate(messages) if m.role == "tool" and counts[i] > max_tokens),
        key=lambda i: -counts[i],
    )
    items = []
    for i in order:
        if total <= target:
            break
        m = messages[i]
        keep_chars = max(200, max_tokens * 3)
        note = (
            f"\n{SPENT_PREFIX} result cut from about {counts[i]} tokens to fit the context; "
            "the full result is archived, recall_history finds it]"
        )
        items.append(TrimItem(m.ref, "shortened", "oversized", counts[i], m.content[:keep_chars] + note))
        total -= counts[i] - (keep_chars // 3)
    return items
