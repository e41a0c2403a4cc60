"""Tool calls written as text, read back tolerantly (seed §5.1, §2.3).

A model without native tool calling is asked to answer a tool call as a JSON block. Small models
get the shape almost right: code fences with or without a language, ``<tool_call>`` tags, prose
before and after, single quotes, Python literals, trailing commas, doubled braces copied from a
template, two calls in one answer, a block cut off at the end. ``parse_tool_text`` repairs those
shapes and says precisely what it could not repair, so the model can be asked to fix its own text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Collection, Iterator

from ..events import ToolCallSpec

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|tool_call|tool|javascript|js)?[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")


@dataclass(frozen=True, slots=True)
class ParsedToolText:
    """What a model's text holds: the prose for the user, the tool calls, and any unreadable call."""

    text: str
    calls: tuple[ToolCallSpec, ...] = ()
    error: str | None = None
    """Set when the text tries to call a tool but the call cannot be read, saying why."""
    repaired: bool = False
    """True when a call was read only after repairing its JSON."""


def parse_tool_text(text: str, tool_names: Collection[str] = ()) -> ParsedToolText:
    """Split a model's text into prose and tool calls, repairing common JSON damage."""
    spans = list(_candidate_spans(text))
    calls: list[ToolCallSpec] = []
    errors: list[str] = []
    repaired = False
    consumed: list[tuple[int, int]] = []
    for start, end, body, explicit in spans:
        found, problem, was_repaired = _calls_in_body(body, tool_names)
        if found:
            calls.extend(found)
            repaired = repaired or was_repaired
            consumed.append((start, end))
        elif explicit or _looks_like_call(body, tool_names):
            errors.append(problem or f'the JSON {_excerpt(body)} has no "name" of a tool and "arguments"')
            consumed.append((start, end))
    prose = _remove_spans(text, consumed)
    error = None if calls or not errors else "; ".join(errors)
    return ParsedToolText(prose, tuple(calls), error, repaired)


def _calls_in_body(body: str, tool_names: Collection[str]) -> tuple[list[ToolCallSpec], str | None, bool]:
    """(calls, problem, repaired) of one block: one JSON value, or several in a row (one call per
    line, as small models write several calls into one block)."""
    value, problem, repaired = _load_lenient(body)
    if problem is None:
        return _calls_in(value, tool_names), None, repaired
    pieces = _json_values(body)
    if len(pieces) < 2:
        return [], problem, False
    calls: list[ToolCallSpec] = []
    for piece in pieces:
        value, piece_problem, piece_repaired = _load_lenient(piece)
        found = _calls_in(value, tool_names) if piece_problem is None else []
        if not found:
            return [], problem, False
        calls.extend(found)
        repaired = repaired or piece_repaired
    return calls, None, repaired


def _json_values(body: str) -> list[str]:
    """The JSON values written one after another in ``body`` (separated by space, newlines or
    commas); anything else between them means it is not such a sequence (an empty list)."""
    values, position = [], 0
    while True:
        start = _next_open(body, position)
        if start < 0:
            break
        if body[position:start].strip(" \t\r\n,"):
            return []
        position = _balanced_end(body, start)
        values.append(body[start:position])
    return values if not body[position:].strip(" \t\r\n,") else []


def _candidate_spans(text: str) -> Iterator[tuple[int, int, str, bool]]:
    """(start, end, json text, explicit): fenced or tagged blocks first, else bare JSON values."""
    marked = [(m.start(), m.end(), m.group(1), True) for m in (*_FENCE.finditer(text), *_TAG.finditer(text))]
    if marked:
        yield from sorted(marked)
        return
    position = 0
    while True:
        start = _next_open(text, position)
        if start < 0:
            return
        end = _balanced_end(text, start)
        yield start, end, text[start:end], False
        position = end


def _next_open(text: str, position: int) -> int:
    brace, bracket = text.find("{", position), text.find("[", position)
    found = [i for i in (brace, bracket) if i >= 0]
    return min(found) if found else -1


def _balanced_end(text: str, start: int) -> int:
    """End of the JSON value opening at ``start`` (string-aware); the text's end if it never closes."""
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _load_lenient(body: str) -> tuple[Any, str | None, bool]:
    """(value, problem, repaired): strict JSON first, then the repairs, in order of how common."""
    body = body.strip()
    if not body:
        return None, "the tool-call block is empty", False
    try:
        return json.loads(body), None, False
    except json.JSONDecodeError as exc:
        first_error = exc
    candidate = _repair(body)
    try:
        return json.loads(candidate), None, True
    except json.JSONDecodeError:
        pass
    return None, f"invalid JSON in {_excerpt(body)}: {first_error.msg} at character {first_error.pos}", False


def _repair(body: str) -> str:
    if body.startswith("{{") and body.rstrip().endswith("}}"):
        body = body.replace("{{", "{").replace("}}", "}")
    body = _normalise_tokens(body)
    body = re.sub(r",\s*([}\]])", r"\1", body)
    return _close_open(body)


def _normalise_tokens(body: str) -> str:
    """Single-quoted strings to JSON strings, Python literals to JSON ones (outside strings)."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch in "\"'":
            j, chars = i + 1, []
            while j < n and body[j] != ch:
                if body[j] == "\\" and j + 1 < n:
                    chars.append(body[j : j + 2])
                    j += 2
                    continue
                chars.append(body[j])
                j += 1
            raw = "".join(chars)
            if ch == "'":
                raw = raw.replace("\\'", "'").replace('"', '\\"')
            out.append('"' + raw.replace("\n", "\\n") + ('"' if j < n else ""))
            i = j + 1
            continue
        match = re.match(r"[A-Za-z_]+", body[i:])
        if match:
            word = match.group(0)
            i += len(word)
            is_key = body[i:].lstrip().startswith(":") and word not in _PY_LITERALS
            out.append(f'"{word}"' if is_key else _PY_LITERALS.get(word, word))
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _close_open(body: str) -> str:
    """Close strings and brackets a truncated answer left open."""
    stack: list[str] = []
    in_string, escaped = False, False
    for ch in body:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    closed = body + ('"' if in_string else "")
    closed = re.sub(r"[,:]\s*$", "", closed.rstrip())
    return closed + "".join(reversed(stack))


def _calls_in(value: Any, tool_names: Collection[str]) -> list[ToolCallSpec]:
    items = value if isinstance(value, list) else [value]
    calls = [_as_call(item, tool_names) for item in items]
    return [c for c in calls if c is not None] if all(c is not None for c in calls) else []


def _as_call(item: Any, tool_names: Collection[str]) -> ToolCallSpec | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):
        item = item["function"]
    name = item.get("name", item.get("tool"))
    if not isinstance(name, str) or not name:
        return None
    arguments = next((item[k] for k in _ARGUMENT_KEYS if k in item), None)
    if arguments is None:
        if name not in tool_names:
            return None
        arguments = {}
    if isinstance(arguments, str):
        loaded, problem, _ = _load_lenient(arguments)
        arguments = loaded if problem is None else arguments
    arguments_json = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCallSpec(f"call_{uuid.uuid4().hex[:24]}", name, arguments_json)


def _looks_like_call(body: str, tool_names: Collection[str]) -> bool:
    if re.search(r"[\"']name[\"']\s*:", body):
        return True
    return any(re.search(rf"[\"']{re.escape(name)}[\"']", body) for name in tool_names)


def _remove_spans(text: str, spans: list[tuple[int, int]]) -> str:
    kept, position = [], 0
    for start, end in sorted(spans):
        kept.append(text[position:start])
        position = end
    kept.append(text[position:])
    return re.sub(r"\n{3,}", "\n\n", "".join(kept)).strip()


def _excerpt(body: str, limit: int = 120) -> str:
    flat = " ".join(body.split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "...")
