"""Tool calling for models that have none natively (seed §5.1, §5.2).

``PromptToolsModel`` wraps any Model. It describes the tools in the system prompt, writes the
history's tool calls and results as plain assistant/user text (``prompt_text``), and reads tool
calls back out of the answer with ``parse_tool_text``. The agent does not change: it sees the same
ModelResponse with ToolCallSpecs as from a native model.

Guarantees:

* Tool-call JSON is never streamed to the user. Text is passed on until something that may open a
  call appears (a code fence, a ``<tool_call>`` tag, a brace); from there it is held back, and
  released at the end only if it turned out not to be a call.
* A call already made in this turn (same tool, near-equal arguments) is dropped and never run
  again, however often the model writes it. If nothing new is left, the model is told so once;
  if it repeats itself again it must answer in text.
* An answer in text (no tools offered, or after repeats) is written with the tool-call openers as
  stop texts, so the model cannot loop on calls; if it writes no text the engine answers from the
  tool results instead.
* An answer that calls several different tools runs the calls of the first one only (a small
  model writes calls that need results it does not have yet); it calls the others once it has
  those results (``one_tool_per_step``).
* A call the parser cannot repair goes back to the model with the parse error, up to
  ``repair_attempts`` times; after that the call fails with a ModelError naming the problem.

Every correction is streamed as a ``ModelCorrection`` (the turn loop records it as a
``ModelCorrected`` event). At most ``repair_attempts`` corrections are sent in one step.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Collection, Sequence

from ..errors import ModelError
from ..events import ToolCallSpec
from ..messages import ChatMessage
from ..tools.guards import canonical_arguments
from .base import (
    BreakerChange,
    CorrectionKind,
    EndpointWait,
    Model,
    ModelChunk,
    ModelCorrection,
    ModelRequest,
    ModelResponse,
    ModelSwitch,
    TextDelta,
    Usage,
)
from .endpoints import Endpoint
from .prompt_text import (
    ANSWER_NOW_REQUEST,
    ANSWER_STOPS,
    NEXT_STEP_HINT,
    NO_TOOLS_REQUEST,
    REPAIR_REQUEST,
    REPEAT_REQUEST,
    TOOL_INSTRUCTIONS,
    call_line,
    describe_tools,
    to_text_messages,
)
from .tokens import TokenCounter
from .tool_text import ParsedToolText, parse_tool_text

_CALL_OPENERS = ("```", "<tool_call>", "{", "[{")
_TURN_TOOLS_KEPT = 256
MODEL_TEXT_CHARS = 2000


@dataclass(frozen=True, slots=True)
class _Attempt:
    text: str
    usage: Usage
    finish_reason: str
    model: str
    cut_from: str = ""
    """The whole text when reading stopped where a second tool's call began (``text`` ends there)."""


@dataclass(slots=True)
class _Step:
    """One model step: what is sent next, and what was corrected so far."""

    messages: list[ChatMessage]
    answer_only: bool
    """Text only: no tools are offered, or the model was told to stop repeating calls."""
    made: set[tuple[str, str]]
    """(tool, canonical arguments) of every call this turn has made already."""
    known: list[str] = field(default_factory=list)
    """The tool names a call may name."""
    attempts: int = 0
    corrections: int = 0
    repeats_told: int = 0
    used: Usage = field(default_factory=Usage)

    def ask_again(self, text: str, correction: str) -> None:
        self.messages = [*self.messages, ChatMessage("assistant", text), ChatMessage.user(correction)]
        self.corrections += 1


class PromptToolsModel(Model):
    """Any Model, given tool calling through its prompt."""

    def __init__(
        self,
        inner: Model,
        *,
        repair_attempts: int = 2,
        one_tool_per_step: bool = True,
        answer_tokens: int | None = None,
    ) -> None:
        self.inner = inner
        self.answer_tokens = answer_tokens
        """A cap on a text answer's length (no tools on offer), below the inner model's own."""
        self.one_tool_per_step = one_tool_per_step
        """Run only the calls of the first tool an answer names; the rest wait for its results."""
        self.name = inner.name
        self.first_token_timeout_s = inner.first_token_timeout_s
        self.response_timeout_s = inner.response_timeout_s
        self.context_window = inner.context_window
        self.timeout_hint = inner.timeout_hint
        self.repair_attempts = repair_attempts
        self.repaired_texts: deque[str] = deque(maxlen=100)
        """Raw answers whose tool calls needed repair or a retry: material for the parser's corpus."""
        self._turn_tools: OrderedDict[tuple[str, str], tuple[dict[str, Any], ...]] = OrderedDict()

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def endpoint(self) -> Endpoint | None:
        return self.inner.endpoint

    @property
    def token_counter(self) -> TokenCounter:
        return self.inner.token_counter

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        """The inner model's count of what it is really sent: tools as prompt text."""
        text_request = ModelRequest(to_text_messages(request.messages, self._described_tools(request)))
        return await self.inner.estimate_input_tokens(text_request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        offered = [str(spec["name"]) for spec in request.tools]
        known = offered or _called_tools(request.messages)
        step = _Step(
            to_text_messages(request.messages, self._described_tools(request, remember=True)),
            answer_only=not offered,
            made=_calls_made(request.messages),
            known=known,
        )
        while True:
            gate = _StreamGate(enabled=bool(known))
            attempt: _Attempt | None = None
            async for item in self._attempt(request, step):
                if isinstance(item, _Attempt):
                    attempt = item
                elif isinstance(item, (ModelSwitch, ModelCorrection, BreakerChange, EndpointWait)):
                    yield item
                else:
                    yield TextDelta(gate.feed(item.text))  # "" while a call is held back: a heartbeat
            assert attempt is not None
            step.attempts += 1
            step.used = step.used + attempt.usage
            parsed = parse_tool_text(attempt.text, known) if known else ParsedToolText(attempt.text)
            if parsed.repaired or parsed.error:
                self.repaired_texts.append(attempt.text)
            decided = self._decide(step, attempt, parsed)
            for chunk in decided:
                if isinstance(chunk, ModelResponse) and not (parsed.calls or parsed.error):
                    if rest := gate.flush():  # held back, but it was no call after all
                        yield TextDelta(rest)
                yield chunk
            if decided and isinstance(decided[-1], ModelResponse):
                return

    def _decide(self, step: _Step, attempt: _Attempt, parsed: ParsedToolText) -> list[ModelChunk]:
        """The step's answer ([..., ModelResponse]) or the correction to send ([ModelCorrection])."""
        if step.answer_only:
            return self._decide_answer(step, attempt, parsed)
        if parsed.error and not parsed.calls:
            if step.corrections >= self.repair_attempts:
                raise ModelError(
                    f"model {self.name!r} wrote a tool call that could not be read after "
                    f"{self.repair_attempts} repair requests: {parsed.error}"
                )
            request = REPAIR_REQUEST.format(error=parsed.error)
            step.ask_again(attempt.text, request)
            return [_correction(step, CorrectionKind.UNREADABLE_CALL, request, attempt.text)]
        calls, repeated = _new_calls(parsed.calls, step.made)
        calls, deferred = _first_tool_only(calls) if self.one_tool_per_step else (calls, ())
        if attempt.cut_from:  # every call it wrote that will not run: from the second tool's on
            skip = {_call_key(c) for c in (*calls, *repeated)}
            deferred = tuple(
                c for c in parse_tool_text(attempt.cut_from, step.known).calls if _call_key(c) not in skip
            )
        notes = [
            _correction(step, kind, "", attempt.cut_from or attempt.text, dropped)
            for kind, dropped in (
                (CorrectionKind.REPEATED_CALL, repeated),
                (CorrectionKind.OTHER_TOOLS, deferred),
            )
            if dropped
        ]
        if calls:  # the new calls run; the others are only dropped
            return [*notes, ModelResponse(parsed.text, calls, step.used, "tool_calls", attempt.model)]
        if not repeated:
            return [ModelResponse(attempt.text, (), step.used, attempt.finish_reason, attempt.model)]
        return self._repeated_only(step, attempt, parsed, repeated)

    def _repeated_only(
        self, step: _Step, attempt: _Attempt, parsed: ParsedToolText, repeated: tuple[ToolCallSpec, ...]
    ) -> list[ModelChunk]:
        """Every call was made before: tell the model once; if it repeats again it must answer."""
        if step.corrections >= self.repair_attempts:
            return [
                _correction(step, CorrectionKind.REPEATED_CALL, "", attempt.text, repeated),
                ModelResponse(parsed.text, (), step.used, "stop", attempt.model),
            ]
        if step.repeats_told:
            request, step.answer_only = ANSWER_NOW_REQUEST, True
        else:
            request = REPEAT_REQUEST.format(calls="; ".join(call_line(c) for c in repeated))
        step.repeats_told += 1
        step.ask_again(attempt.text, request)
        return [_correction(step, CorrectionKind.REPEATED_CALL, request, attempt.text, repeated)]

    def _decide_answer(self, step: _Step, attempt: _Attempt, parsed: ParsedToolText) -> list[ModelChunk]:
        """A text answer: any call in it is dropped; no text at all is corrected once more."""
        wrote_call = bool(parsed.calls or parsed.error)
        text = parsed.text if wrote_call else attempt.text
        if text.strip() or step.corrections >= self.repair_attempts:
            finish = "stop" if wrote_call else attempt.finish_reason
            answer = ModelResponse(text, (), step.used, finish, attempt.model)
            if not parsed.calls:
                return [answer]
            return [
                _correction(step, CorrectionKind.CALL_WITHOUT_TOOLS, "", attempt.text, parsed.calls),
                answer,
            ]
        kind = (
            CorrectionKind.CALL_WITHOUT_TOOLS if wrote_call or not attempt.text else CorrectionKind.NO_ANSWER
        )
        step.ask_again(attempt.text, NO_TOOLS_REQUEST)
        return [_correction(step, kind, NO_TOOLS_REQUEST, attempt.text, parsed.calls)]

    async def _attempt(
        self, request: ModelRequest, step: _Step
    ) -> AsyncIterator[TextDelta | ModelSwitch | BreakerChange | EndpointWait | _Attempt]:
        stop, cap = (ANSWER_STOPS, self.answer_tokens) if step.answer_only else ((), None)
        inner_request = ModelRequest(
            step.messages, (), request.session_id, request.turn_id, stop, cap, endpoints=request.endpoints
        )
        cut = _SecondTool(step.known) if self.one_tool_per_step and not step.answer_only else None
        text = ""
        chunks = self.inner.stream(inner_request)
        try:
            async for chunk in chunks:
                if isinstance(chunk, TextDelta):
                    yield chunk
                    text += chunk.text
                    at = cut.find(text) if cut is not None and chunk.text else None
                    if at is not None:  # stop the model: what follows waits for the first tool's results
                        yield _Attempt(text[:at], await self._usage(step, text[:at]), "tool_calls", "", text)
                        return
                elif isinstance(chunk, (ModelSwitch, BreakerChange, EndpointWait)):
                    yield chunk
                elif isinstance(chunk, ModelResponse):
                    yield _Attempt(chunk.text, chunk.usage, chunk.finish_reason, chunk.model)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def _usage(self, step: _Step, written: str) -> Usage:
        """A stopped stream reports no usage: the prompt and the text written, counted here."""
        sent = await self.inner.estimate_input_tokens(ModelRequest(step.messages))
        return Usage(sent, self.inner.token_counter.count(written))

    def _described_tools(self, request: ModelRequest, *, remember: bool = False) -> Sequence[dict[str, Any]]:
        """The tools the system prompt describes: those offered, or for a call without tools the
        ones the same turn was offered before, so the prompt keeps its prefix (the cached part)."""
        key = (request.session_id, request.turn_id)
        if request.tools:
            if remember and all(key):
                self._turn_tools[key] = tuple(request.tools)
                self._turn_tools.move_to_end(key)
                while len(self._turn_tools) > _TURN_TOOLS_KEPT:
                    self._turn_tools.popitem(last=False)
            return request.tools
        return self._turn_tools.get(key, ())


def _correction(
    step: _Step, kind: CorrectionKind, request: str, text: str, dropped: Sequence[ToolCallSpec] = ()
) -> ModelCorrection:
    return ModelCorrection(step.attempts, kind, request, text[:MODEL_TEXT_CHARS], tuple(dropped))


def _call_key(call: ToolCallSpec) -> tuple[str, str]:
    return call.name, canonical_arguments(call.arguments_json)


def _calls_made(messages: Sequence[ChatMessage]) -> set[tuple[str, str]]:
    """The calls the current turn (everything after the last user message) already made."""
    made: set[tuple[str, str]] = set()
    for message in reversed(messages):
        if message.role == "user":
            break
        made.update(_call_key(c) for c in message.tool_calls)
    return made


def _new_calls(
    calls: Sequence[ToolCallSpec], made: set[tuple[str, str]]
) -> tuple[tuple[ToolCallSpec, ...], tuple[ToolCallSpec, ...]]:
    """(calls to run, calls dropped): a call made before in the turn, or twice in one answer, is dropped."""
    seen = set(made)
    new: list[ToolCallSpec] = []
    dropped: list[ToolCallSpec] = []
    for call in calls:
        key = _call_key(call)
        (dropped if key in seen else new).append(call)
        seen.add(key)
    return tuple(new), tuple(dropped)


class _SecondTool:
    """Finds where an answer begins a call of a second tool: the ``{`` that opens a call object
    whose first key is "name", naming a tool. A "name" inside arguments (an object that is the
    value of a key) never counts."""

    _NAME = re.compile(r'["\']name["\']\s*:\s*["\']([^"\']+)["\']')

    def __init__(self, tools: Collection[str]) -> None:
        self.tools = set(tools)

    def find(self, text: str) -> int | None:
        first = ""
        for match in self._NAME.finditer(text):
            opening = text.rfind("{", 0, match.start())
            if (
                opening < 0
                or text[opening + 1 : match.start()].strip()
                or text[:opening].rstrip().endswith(":")
            ):
                continue  # not the first key of a call object
            name = match.group(1)
            if name not in self.tools:
                continue
            if not first:
                first = name
            elif name != first:
                return opening
        return None


def _first_tool_only(
    calls: tuple[ToolCallSpec, ...],
) -> tuple[tuple[ToolCallSpec, ...], tuple[ToolCallSpec, ...]]:
    """(the calls of the first tool named, the rest): a small model writes calls that need another
    call's result before it has it (notices for orders it has not looked up yet), while calls it can
    really make together are the same tool on several items."""
    if not calls:
        return calls, ()
    first = calls[0].name
    return tuple(c for c in calls if c.name == first), tuple(c for c in calls if c.name != first)


def _called_tools(messages: Sequence[ChatMessage]) -> list[str]:
    return sorted({m.name for m in messages if m.role == "tool" and m.name})


class _StreamGate:
    """Passes text through until a possible tool call opens; holds the rest back."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.seen = ""
        self.released = 0
        self.holding = False

    def feed(self, text: str) -> str:
        self.seen += text
        if not self.enabled:
            return self._release(len(self.seen))
        if self.holding:
            return ""
        opened = min(
            (i for i in (self.seen.find(o, self.released) for o in _CALL_OPENERS) if i >= 0), default=-1
        )
        if opened >= 0:
            self.holding = True
            return self._release(opened)
        return self._release(len(self.seen) - _partial_opener_length(self.seen))

    def flush(self) -> str:
        return self._release(len(self.seen))

    def _release(self, upto: int) -> str:
        out = self.seen[self.released : upto]
        self.released = max(self.released, upto)
        return out


def _partial_opener_length(text: str) -> int:
    """How many trailing characters could be the start of a call opener (kept back for now)."""
    for length in range(max(len(o) for o in _CALL_OPENERS) - 1, 0, -1):
        tail = text[-length:]
        if any(o.startswith(tail) and o != tail for o in _CALL_OPENERS):
            return length
    return 0


__all__ = [
    "ANSWER_NOW_REQUEST",
    "ANSWER_STOPS",
    "NEXT_STEP_HINT",
    "NO_TOOLS_REQUEST",
    "PromptToolsModel",
    "REPAIR_REQUEST",
    "REPEAT_REQUEST",
    "TOOL_INSTRUCTIONS",
    "describe_tools",
    "to_text_messages",
]
