"""Summaries that keep what later turns need (seed §3.2).

A model writes the summary, told to keep the user's preferences, conclusions and decisions
(the final one when a decision was corrected), open items, and every id and number. When the
model fails (an error, a timeout, an empty answer) the extractive summary stands in: the lines
of the earlier conversation that carry those things, picked by rule, so the session goes on
and says so.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Sequence

from ..messages import SUMMARY_HEADER, ChatMessage, calls_text
from ..models.base import Model, ModelRequest, ModelResponse, TextDelta, Usage
from ..models.endpoints import Endpoints
from ..models.limits import stream_within

EXTRACTIVE = "extractive"
PROMPT = """You compress the earlier part of a conversation between a user and an assistant so the \
assistant can continue without it. Write short lines under these headings, leaving out empty ones:
Preferences: what the user likes, wants, or asked to always or never do.
Decisions and conclusions: what was decided or found; when a decision was corrected, only the final one.
Open items: what is still to do or to answer.
Facts: every id, order number, amount, date, name and number a later step may need, with what it is.
Keep the user's own words for preferences. No preamble, no commentary."""
FALLBACK_NOTE = "(The summariser was unavailable; these lines were extracted from the earlier conversation.)"
NUMBER = re.compile(r"\d")
KEEP = re.compile(
    r"\d|prefer|always|never|please|don'?t|do not|must|should|want|need|like|decid|agree|conclu|"
    r"instead|actually|correct|change|todo|to do|pending|still|remember|deadline|budget|only|"
    r"喜欢|偏好|总是|不要|别|必须|需要|希望|决定|同意|结论|改为|改成|其实|待办|下一步|记住|预算|截止",
    re.IGNORECASE,
)
SENTENCE = re.compile(r"(?<=[.!?。！？;；])\s*|\n+")


@dataclass(frozen=True, slots=True)
class SummaryCall:
    """The summariser's model call, as the log records it (an AuxiliaryModelCall)."""

    model: str
    usage: Usage | None
    """The provider's usage if an answer arrived; None if the call failed before one."""
    sent_tokens: int
    """The request's size counted before sending."""
    streamed: str
    """Text streamed back before the answer (or the failure)."""
    latency_ms: float
    error: str = ""


@dataclass(frozen=True, slots=True)
class Summary:
    text: str
    summarizer: str
    fallback: bool = False
    error: str = ""
    call: SummaryCall | None = None
    """The model call that was made (None for the extractive summary alone)."""


def transcript(messages: Sequence[ChatMessage]) -> str:
    """The messages as plain text for the summariser (a summary already in them included)."""
    lines = []
    for m in messages:
        if m.role == "system" and m.content.startswith(SUMMARY_HEADER):
            lines.append(f"[earlier summary]\n{m.content.removeprefix(SUMMARY_HEADER)}")
        elif m.role == "tool":
            lines.append(f"[tool {m.name} result] {m.content}")
        elif m.tool_calls:
            lines.append(
                f"[assistant calls] {calls_text(m.tool_calls)}" + (f" {m.content}" if m.content else "")
            )
        else:
            lines.append(f"[{m.role}] {m.content}")
    return "\n".join(lines)


async def summarize(
    model: Model | None,
    messages: Sequence[ChatMessage],
    *,
    max_chars: int,
    first_token_s: float,
    response_s: float,
    endpoints: Endpoints | None = None,
) -> Summary:
    """A summary of ``messages`` by ``model``; the extractive one if there is no model or it fails."""
    if model is None:
        return Summary(extractive_summary(messages, max_chars), EXTRACTIVE)
    request = ModelRequest(
        [ChatMessage.system(PROMPT), ChatMessage.user(transcript(messages))],
        session_id="",
        turn_id="",
        endpoints=endpoints,
    )
    sent = await model.estimate_input_tokens(request)
    started = time.perf_counter()
    streamed: list[str] = []
    response: ModelResponse | None = None
    error = ""
    try:
        async for chunk in stream_within(model, request, first_token_s, response_s):
            if isinstance(chunk, ModelResponse):
                response = chunk
            elif isinstance(chunk, TextDelta):
                streamed.append(chunk.text)
        text = response.text.strip() if response is not None else ""
        if not (text and response is not None and not response.tool_calls):
            error = "the summariser gave no summary text"
    except Exception as exc:  # any failure falls back; the session must go on
        error = f"{type(exc).__name__}: {exc}"
    latency = round((time.perf_counter() - started) * 1000, 3)
    made = SummaryCall(
        (response.model if response is not None else "") or model.name,
        response.usage if response is not None else None,
        sent,
        "".join(streamed),
        latency,
        error[:500],
    )
    if not error:
        return Summary(text[:max_chars], model.name, call=made)
    text = FALLBACK_NOTE + "\n" + extractive_summary(messages, max_chars - len(FALLBACK_NOTE) - 1)
    return Summary(text, EXTRACTIVE, fallback=True, error=error[:500], call=made)


def extractive_summary(messages: Sequence[ChatMessage], max_chars: int) -> str:
    """Lines that carry preferences, decisions, open items, ids and numbers, in their order.
    The user's own lines come first when they do not all fit, then the newest (a correction
    comes after what it corrects); a line said twice is kept once."""
    candidates: list[tuple[int, str]] = []  # (priority, line)
    for m in messages:
        if m.role == "system" and m.content.startswith(SUMMARY_HEADER):
            body = m.content.removeprefix(SUMMARY_HEADER).removeprefix(FALLBACK_NOTE)
            candidates += [(2, line) for line in body.splitlines() if line.strip()]
            continue
        for sentence in SENTENCE.split(m.content):
            sentence = sentence.strip()
            if not sentence:
                continue
            if m.role == "user" and KEEP.search(sentence):
                candidates.append((2, f"- user: {sentence[:300]}"))
            elif m.role != "user" and NUMBER.search(sentence):
                who = f"tool {m.name}" if m.role == "tool" else "assistant"
                candidates.append((1, f"- {who}: {sentence[:300]}"))
        for call in m.tool_calls:
            candidates.append((1, f"- called {call.name}({call.arguments_json[:200]})"))
    unique: dict[str, int] = {}
    for position, (_, line) in enumerate(candidates):
        unique.setdefault(line, position)
    ranked = sorted(unique.items(), key=lambda item: (-candidates[item[1]][0], -item[1]))
    chosen, size = [], 0
    for line, position in ranked:
        if size + len(line) + 1 <= max_chars:
            chosen.append((position, line))
            size += len(line) + 1
    return "\n".join(line for _, line in sorted(chosen))
