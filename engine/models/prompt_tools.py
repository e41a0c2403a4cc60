"""Tool calling for models that have none natively (seed §5.1, §5.2).

``PromptToolsModel`` wraps any Model. It describes the tools in the system prompt, turns the
history's tool calls and results into plain assistant/user text the model's chat template accepts,
and reads tool calls back out of the answer with ``parse_tool_text``. The agent does not change:
it sees the same ModelResponse with ToolCallSpecs as from a native model.

Two guarantees:

* Tool-call JSON is never streamed to the user. Text is passed on until something that may open a
  call appears (a code fence, a ``<tool_call>`` tag, a brace); from there it is held back, and
  released at the end only if it turned out not to be a call.
* A call the parser cannot repair goes back to the model with the parse error and its own text,
  up to ``repair_attempts`` times; after that the call fails with a ModelError naming the problem.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from ..errors import ModelError
from ..events import ToolCallSpec
from ..messages import ChatMessage
from .base import Model, ModelChunk, ModelRequest, ModelResponse, ModelSwitch, TextDelta, Usage
from .tokens import TokenCounter
from .tool_text import ParsedToolText, parse_tool_text

_CALL_OPENERS = ("```", "<tool_call>", "{", "[{")

TOOL_INSTRUCTIONS = """\
# Tools
You can call the tools listed below. To call a tool, reply with only this block and nothing else:
```json
{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}
```
To call several tools at once, write one block per call. Tool results come back in a message that
starts with "Tool result". When the results answer the request, stop calling tools and reply to the
user in plain text, without any JSON.

Available tools:
{tools}"""

REPAIR_REQUEST = (
    "Your tool call could not be read: {error}. Write the call again as exactly one ```json block "
    'with {{"name": ..., "arguments": {{...}}}} and valid JSON (double quotes, no trailing commas).'
)


NO_TOOLS_REQUEST = (
    "Tools cannot be called any more for this request. Do not write any JSON. Answer the user now "
    "in plain text, from the tool results above."
)
NEXT_STEP_HINT = (
    "\n\n(If the request still needs a tool, write its block. If everything asked for is done, "
    "do not call any tool again: answer the user in plain text.)"
)


REPEAT_REQUEST = (
    "You already made exactly this call and its result is above. Do not repeat it. If the request "
    "needs a different tool call, write that one; otherwise answer the user now in plain text."
)


def _repeats_last_calls(calls: Sequence[ToolCallSpec], messages: Sequence[ChatMessage]) -> bool:
    """True if ``calls`` are exactly the previous step's calls (same tools, same arguments)."""
    previous = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if previous is None or not previous.tool_calls:
        return False
    return [_call_key(c) for c in calls] == [_call_key(c) for c in previous.tool_calls]


def _call_key(call: ToolCallSpec) -> tuple[str, Any]:
    return call.name, _arguments(call.arguments_json)


def _called_tools(messages: Sequence[ChatMessage]) -> list[str]:
    return sorted({m.name for m in messages if m.role == "tool" and m.name})


@dataclass(frozen=True, slots=True)
class _Attempt:
    text: str
    usage: Usage
    finish_reason: str
    model: str


class PromptToolsModel(Model):
    """Any Model, given tool calling through its prompt."""

    def __init__(self, inner: Model, *, repair_attempts: int = 2) -> None:
        self.inner = inner
        self.name = inner.name
        self.first_token_timeout_s = inner.first_token_timeout_s
        self.response_timeout_s = inner.response_timeout_s
        self.context_window = inner.context_window
        self.repair_attempts = repair_attempts
        self.repaired_texts: deque[str] = deque(maxlen=100)
        """Raw answers whose tool calls needed repair or a retry: material for the parser's corpus."""

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def token_counter(self) -> TokenCounter:
        return self.inner.token_counter

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        """The inner model's count of what it is really sent: tools as prompt text."""
        text_request = ModelRequest(to_text_messages(request.messages, request.tools))
        return await self.inner.estimate_input_tokens(text_request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        offered = [str(spec["name"]) for spec in request.tools]
        known = offered or _called_tools(request.messages)
        messages = to_text_messages(request.messages, request.tools)
        used = Usage()
        for attempt_number in range(self.repair_attempts + 1):
            # without tools on offer (a closing call) a model that has used them may still write one
            gate = _StreamGate(enabled=bool(known))
            attempt: _Attempt | None = None
            async for item in self._attempt(request, messages):
                if isinstance(item, _Attempt):
                    attempt = item
                elif isinstance(item, ModelSwitch):
                    yield item
                else:
                    yield TextDelta(gate.feed(item.text))  # "" while a call is held back: a heartbeat
            assert attempt is not None
            used = used + attempt.usage
            parsed = parse_tool_text(attempt.text, known) if known else ParsedToolText(attempt.text)
            if parsed.repaired or parsed.error:
                self.repaired_texts.append(attempt.text)
            last = attempt_number == self.repair_attempts
            if parsed.calls and offered and not last and _repeats_last_calls(parsed.calls, request.messages):
                # small models tend to repeat a call that already succeeded instead of answering
                messages = [
                    *messages,
                    ChatMessage("assistant", attempt.text),
                    ChatMessage.user(REPEAT_REQUEST),
                ]
                continue
            wrote_call = bool(parsed.calls)
            if parsed.calls and not offered:  # a call when none may be made: ask for the answer
                if not last:
                    messages = [
                        *messages,
                        ChatMessage("assistant", attempt.text),
                        ChatMessage.user(NO_TOOLS_REQUEST),
                    ]
                    continue
                parsed = ParsedToolText(parsed.text)  # the prose, or nothing: the engine fills in
            if parsed.error is None:
                if not wrote_call and (rest := gate.flush()):  # held back, but it was no call after all
                    yield TextDelta(rest)
                text = parsed.text if parsed.calls or not offered else attempt.text
                finish = "tool_calls" if parsed.calls else attempt.finish_reason
                yield ModelResponse(text, parsed.calls, used, finish, attempt.model)
                return
            if last:
                raise ModelError(
                    f"model {self.name!r} wrote a tool call that could not be read after "
                    f"{self.repair_attempts} repair requests: {parsed.error}"
                )
            messages = [
                *messages,
                ChatMessage("assistant", attempt.text),
                ChatMessage.user(REPAIR_REQUEST.format(error=parsed.error)),
            ]

    async def _attempt(
        self, request: ModelRequest, messages: list[ChatMessage]
    ) -> AsyncIterator[TextDelta | ModelSwitch | _Attempt]:
        inner_request = ModelRequest(messages, (), request.session_id, request.turn_id)
        async for chunk in self.inner.stream(inner_request):
            if isinstance(chunk, (TextDelta, ModelSwitch)):
                yield chunk
            else:
                yield _Attempt(chunk.text, chunk.usage, chunk.finish_reason, chunk.model)


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


def to_text_messages(messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]]) -> list[ChatMessage]:
    """The history with tools described in the system prompt and tool traffic written as text.

    System messages before the conversation form the system prompt; one that comes later (the
    engine's note for a closing call) is put into the conversation where it was, because small
    models follow the end of the prompt more than its start.
    """
    leading = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    system = [m.content for m in messages[:leading]]
    if tools:
        system.append(TOOL_INSTRUCTIONS.format(tools=describe_tools(tools)))
    out: list[ChatMessage] = [ChatMessage.system("\n\n".join(system))] if system else []
    for message in messages[leading:]:
        if message.role == "assistant":
            out.append(ChatMessage("assistant", _assistant_text(message)))
        elif message.role == "tool":
            _append_user(
                out, f"Tool result of {message.name} (call {message.tool_call_id}):\n{message.content}"
            )
        else:
            _append_user(out, message.content)
    if tools and messages and messages[-1].role == "tool":
        out[-1] = ChatMessage.user(out[-1].content + NEXT_STEP_HINT)
    return out


def describe_tools(tools: Sequence[dict[str, Any]]) -> str:
    lines = []
    for spec in tools:
        schema = json.dumps(spec.get("parameters", {}), ensure_ascii=False, separators=(",", ":"))
        lines.append(f"- {spec['name']}: {spec.get('description', '').strip()}\n  parameters: {schema}")
    return "\n".join(lines)


def _assistant_text(message: ChatMessage) -> str:
    blocks = [
        "```json\n"
        + json.dumps({"name": c.name, "arguments": _arguments(c.arguments_json)}, ensure_ascii=False)
        + "\n```"
        for c in message.tool_calls
    ]
    return "\n".join([message.content, *blocks] if message.content else blocks)


def _arguments(arguments_json: str) -> Any:
    try:
        return json.loads(arguments_json)
    except json.JSONDecodeError:
        return arguments_json


def _append_user(out: list[ChatMessage], text: str) -> None:
    """Consecutive user-side texts become one message: many chat templates require alternation."""
    if out and out[-1].role == "user":
        out[-1] = ChatMessage.user(out[-1].content + "\n\n" + text)
    else:
        out.append(ChatMessage.user(text))
