"""How a model without native tool calling is told about tools, and how the history's tool traffic
is written for it as plain text (used by ``PromptToolsModel``).

The text is built so that one step's prompt is a prefix of the next one's: the tool section is
fixed for a turn, earlier calls and results are written the same way every time (the hint after
each batch of results included), and what belongs to one step only (corrections) comes last. A
server with a prompt cache (llama.cpp's ``cache_prompt``) then processes only each step's new
tokens.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..events import ToolCallSpec
from ..messages import ChatMessage

TOOL_INSTRUCTIONS = """\
# Tools
To call a tool, reply with only a ```json block. To call a tool for several items, write one \
call per line in the same block:
```json
{"name": "<tool name>", "arguments": {<arguments for the first item>}}
{"name": "<tool name>", "arguments": {<arguments for the second item>}}
```
A call that needs another call's result waits for that result: use only values you already have. \
Results come back in a message that starts with "Tool result". Never repeat a call that already \
has a result. When the request is done, reply to the user in plain text, without any JSON.

Available tools:
"""

NEXT_STEP_HINT = (
    "\n\n(If the request still needs tools, write all the calls that are left in one block. If "
    "everything asked for is done, answer the user in plain text.)"
)

REPAIR_REQUEST = (
    "Your tool call could not be read: {error}. Write the calls again as one ```json block with one "
    '{{"name": ..., "arguments": {{...}}}} per line, in valid JSON (double quotes, no trailing commas).'
)
REPEAT_REQUEST = (
    "These calls were already made in this request, and their results are above: {calls}. They were "
    "not run again. If something asked for is still not done, write the call for it; otherwise "
    "answer the user now in plain text."
)
ANSWER_NOW_REQUEST = (
    "Those calls were already made and were not run again. Do not call any tool. Answer the user "
    "now in plain text, from the tool results above."
)
NO_TOOLS_REQUEST = (
    "Tools cannot be called any more for this request. Do not write any JSON. Answer the user now "
    "in plain text, from the tool results above."
)
ANSWER_STOPS = ("```", "<tool_call>", '{"name"', "Tool result of")
"""Where a model that must answer in text stops writing: the openers of a tool call, and the
start of a tool result (a small model may imitate one instead of answering)."""


def to_text_messages(messages: Sequence[ChatMessage], tools: Sequence[dict[str, Any]]) -> list[ChatMessage]:
    """The history with tools described in the system prompt and tool traffic written as text.

    System messages before the conversation form the system prompt; one that comes later (the
    engine's note for a closing call) is put into the conversation where it was, because small
    models follow the end of the prompt more than its start. Every batch of tool results ends with
    the same hint, in the newest batch and in the older ones alike, so what was sent for one step
    is unchanged in the next (the prompt cache then covers it, and the calls the model wrote).
    """
    leading = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    system = [m.content for m in messages[:leading]]
    if tools:
        system.append(TOOL_INSTRUCTIONS + describe_tools(tools))
    out: list[ChatMessage] = [ChatMessage.system("\n\n".join(system))] if system else []
    conversation = messages[leading:]
    for i, message in enumerate(conversation):
        if message.role == "assistant":
            out.append(ChatMessage("assistant", assistant_text(message.content, message.tool_calls)))
        elif message.role == "tool":
            _append_user(
                out, f"Tool result of {message.name} (call {message.tool_call_id}):\n{message.content}"
            )
            batch_ends = i + 1 == len(conversation) or conversation[i + 1].role != "tool"
            if tools and batch_ends:
                out[-1] = ChatMessage.user(out[-1].content + NEXT_STEP_HINT)
        else:
            _append_user(out, message.content)
    return out


def describe_tools(tools: Sequence[dict[str, Any]]) -> str:
    """One line per tool, ``- name(param: type, opt: type = default, other?: type): description``:
    what the JSON Schema says in a fraction of its tokens (nested schemas are written as JSON)."""
    lines = []
    for spec in tools:
        description = " ".join(str(spec.get("description", "")).split())
        lines.append(f"- {spec['name']}({signature(spec.get('parameters') or {})}): {description}")
    return "\n".join(lines)


def signature(schema: dict[str, Any]) -> str:
    required = set(schema.get("required") or ())
    parts = []
    for name, prop in (schema.get("properties") or {}).items():
        if name in required:
            parts.append(f"{name}: {_type_of(prop)}")
        elif "default" in prop:
            parts.append(f"{name}: {_type_of(prop)} = {json.dumps(prop['default'], ensure_ascii=False)}")
        else:
            parts.append(f"{name}?: {_type_of(prop)}")
    return ", ".join(parts)


def _type_of(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in prop["enum"])
    kind = prop.get("type")
    if kind in ("string", "integer", "number", "boolean"):
        fmt = {"date": " YYYY-MM-DD", "date-time": " (ISO 8601)"}.get(str(prop.get("format")), "")
        return f"{kind}{fmt}"
    if kind == "array" and isinstance(prop.get("items"), dict) and "type" in prop["items"]:
        return f"list of {_type_of(prop['items'])}"
    bare = {k: v for k, v in prop.items() if k not in ("title", "default")}
    return json.dumps(bare, ensure_ascii=False, separators=(",", ":"))


def assistant_text(content: str, calls: Sequence[ToolCallSpec]) -> str:
    """An assistant message as the model is asked to write it: prose, then one block of calls."""
    if not calls:
        return content
    block = "```json\n" + "\n".join(call_line(c) for c in calls) + "\n```"
    return f"{content}\n{block}" if content else block


def call_line(call: ToolCallSpec) -> str:
    return json.dumps(
        {"name": call.name, "arguments": arguments_value(call.arguments_json)}, ensure_ascii=False
    )


def arguments_value(arguments_json: str) -> Any:
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
