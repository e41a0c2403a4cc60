"""Which event fields are content and which are metadata: the one table encryption and erasure
read (docs/architecture.md, "Data lifecycle").

Content is what a person wrote or what was derived from it: it is encrypted with the session's
data key where the log persists it, and reads as erased once that key is destroyed. Metadata
(ids, states, timings, tokens, costs, models, tool names and statuses, the reasons the engine
writes) stays clear, so analytics, replays and the viewer's charts survive an erasure.
tests/test_crypto_fields.py checks that every str field of every event type is in exactly one
of ``CONTENT`` and ``METADATA``.

An erased value keeps its field parseable: text reads ``[erased]``, a JSON object
``{"erased": true}``, a JSON list ``[]`` (a list cannot say so without breaking the code that
reads its items), and a snapshot's state ``[erased]`` (its loader then folds the events).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

from ..events import Event, ToolCallSpec

Shape = Literal["text", "object", "list", "state", "calls"]
"""How a content field reads: plain text, a JSON object, a JSON list, a snapshot's state (the
snapshot format's JSON), or ``AssistantMessage.tool_calls`` (each call's ``arguments_json``)."""

ERASED_TEXT = "[erased]"
ERASED_OBJECT = '{"erased": true}'
ERASED_LIST = "[]"
ERASED: dict[Shape, str] = {
    "text": ERASED_TEXT,
    "object": ERASED_OBJECT,
    "list": ERASED_LIST,
    "state": ERASED_TEXT,
    "calls": ERASED_OBJECT,
}
"""What a content field of each shape reads once its key is gone (for ``calls``: each call's
arguments)."""

CONTENT: dict[str, dict[str, Shape]] = {
    "SessionCreated": {"metadata_json": "object"},
    "UserMessageReceived": {"text": "text"},
    "ModelCorrected": {"correction": "text", "model_text": "text", "dropped_calls_json": "list"},
    "AssistantMessage": {"text": "text", "tool_calls": "calls"},
    "ToolCallRequested": {"arguments_json": "object"},
    "ToolCallFinished": {"content": "text", "output_json": "object", "error": "text"},
    "ApprovalRequested": {"arguments_json": "object"},
    "ApprovalDecided": {"arguments_json": "object", "note": "text"},
    "ToolInvoked": {"arguments_json": "object", "content": "text", "output_json": "object", "error": "text"},
    "SnapshotTaken": {"state_json": "state"},
    "SessionForked": {"state_json": "state", "origin_calls_json": "list"},
    "ContextTrimmed": {"items_json": "list"},
    "HistorySummarized": {"summary": "text"},
    "HistoryRecalled": {"query": "text", "text": "text"},
    "MemoriesRetrieved": {"query": "text", "memories_json": "list"},
    "MemoryNoted": {"text": "text"},
    "TaskStateChanged": {"patch_json": "list", "state_json": "object"},
    "BudgetDecided": {"note": "text"},
}
"""Event type -> its content fields and their shapes."""

TWINS: dict[str, dict[str, str]] = {
    "ToolCallFinished": {"output_json": "content"},
    "ToolInvoked": {"output_json": "content"},
}
"""A field that often holds the same text as an earlier content field of its event (a tool's
JSON result is also what the model reads): sealed as a reference to it (``sealed.REF``), so the
text is encrypted and stored once."""

METADATA: dict[str, tuple[str, ...]] = {
    "SessionCreated": ("agent_id", "user_id", "role", "model"),
    "UserMessageReceived": ("message_id", "user_id"),
    "UserMessageDropped": ("message_id", "reason", "detail"),
    "TurnStarted": ("turn_id", "message_id"),
    "StateChanged": ("from_state", "to_state", "cause", "detail"),
    "ModelCallStarted": ("turn_id", "model", "section_tokens_json"),
    "ModelCallFinished": ("turn_id", "model", "status", "finish_reason", "error"),
    "AuxiliaryModelCall": ("turn_id", "purpose", "model", "status", "error"),
    "ModelFallback": ("turn_id", "from_model", "to_model", "reason", "cause"),
    "ModelBreakerChanged": ("turn_id", "model", "endpoint", "from_state", "to_state", "reason"),
    "ModelCorrected": ("turn_id", "kind"),
    "AssistantMessage": ("turn_id", "message_id"),
    "ToolCallRequested": ("turn_id", "call_id", "tool_name"),
    "ToolCallStarted": ("turn_id", "call_id", "tool_name", "idempotency_key"),
    "ToolCallFinished": ("turn_id", "call_id", "tool_name", "status"),
    "TurnFinished": ("turn_id", "message_id", "reason"),
    "SessionClosed": ("reason", "actor"),
    "ApprovalRequested": ("turn_id", "call_id", "tool_name", "sensitivity", "reason"),
    "ApprovalDecided": ("turn_id", "call_id", "decision", "actor"),
    "LoopGuardTriggered": ("turn_id", "guard", "reason", "tool_name"),
    "ToolResultSuperseded": ("turn_id", "call_id", "superseded_by"),
    "ToolInvoked": ("call_id", "tool_name", "actor", "status"),
    "SnapshotTaken": ("status", "last_tool"),
    "CancelRequested": ("reason", "actor"),
    "SessionForked": ("origin_session_id", "agent_id", "model", "unfinished"),
    "ContextTrimmed": ("turn_id",),
    "HistorySummarized": ("turn_id", "removed_refs_json", "summarizer", "reason", "error"),
    "HistoryRecalled": ("turn_id", "refs_json"),
    "MemoriesRetrieved": ("turn_id",),
    "MemoryNoted": ("turn_id", "call_id", "user_id", "tag"),
    "TaskStateChanged": ("turn_id", "call_id", "op"),
    "BudgetExceeded": ("turn_id", "level"),
    "BudgetDecided": ("turn_id", "decision", "actor"),
    "SessionErased": ("erasure_id", "scope", "reason", "actor", "user_id"),
}
"""Event type -> the str fields that stay clear on purpose. The free-text reasons (a cancel's,
a close's, a state change's detail) are metadata: the engine and admins write them, and the API
says not to put personal data in them; tool and model errors the engine records about a call
are too (a tool's own error text is content: ``ToolCallFinished.error``)."""

CONTENT_FIELDS: dict[str, tuple[tuple[str, Shape], ...]] = {
    name: tuple(fields.items()) for name, fields in CONTENT.items()
}
"""``CONTENT`` as tuples, for the per-event loops of the codec path."""


def replaced(event: Event, changes: dict[str, Any]) -> Event:
    """``event`` with the content fields in ``changes`` replaced: ``dataclasses.replace`` for the
    codec path, made per event type, at about a third of its cost (it runs for every event a
    persisting log writes or reads)."""
    copy = _COPIES.get(type(event))
    if copy is None:
        copy = _COPIES[type(event)] = _copier(type(event))
    return copy(event, changes)


_COPIES: dict[type[Event], Callable[[Event, dict[str, Any]], Event]] = {}


def _copier(cls: type[Event]) -> Callable[[Event, dict[str, Any]], Event]:
    """A function that copies a slotted frozen event, taking the content fields from ``changes``
    when there (the others are copied as they are), through the slots' descriptors."""
    content = set(CONTENT.get(cls.type, {}))
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = ["def copy(e, ch):", "    n = _new(_cls)"]
    for f in dataclasses.fields(cls):
        scope[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        value = f"ch.get({f.name!r}, e.{f.name})" if f.name in content else f"e.{f.name}"
        lines.append(f"    _set_{f.name}(n, {value})")
    lines.append("    return n")
    exec(compile("\n".join(lines) + "\n", f"<{cls.__name__} copy>", "exec"), scope)
    copy: Callable[[Event, dict[str, Any]], Event] = scope["copy"]
    return copy


def is_erased(value: str | None) -> bool:
    """Whether a content value reads as erased (its key was destroyed)."""
    return value in (ERASED_TEXT, ERASED_OBJECT)


def erased_calls(calls: tuple[ToolCallSpec, ...]) -> tuple[ToolCallSpec, ...]:
    """Tool calls with their arguments erased (their ids and tool names are metadata)."""
    return tuple(ToolCallSpec(c.call_id, c.name, ERASED_OBJECT) for c in calls)


def scrubbed(event: Event) -> Event:
    """``event`` as it reads once its session's key is gone: every content field erased. A
    process that held the event decoded replaces it with this (engine.log.kafka_index)."""
    fields = CONTENT_FIELDS.get(event.type)
    if not fields:
        return event
    changes: dict[str, Any] = {}
    for name, shape in fields:
        value = getattr(event, name)
        if shape == "calls":
            if value:
                changes[name] = erased_calls(value)
        elif value:  # "" and None stay: they hold nothing
            changes[name] = ERASED[shape]
    return replaced(event, changes) if changes else event


def content_values(event: Event) -> list[str]:
    """Every content value ``event`` holds, as text (tests plant and look for them)."""
    found: list[str] = []
    for name, shape in CONTENT_FIELDS.get(event.type, ()):
        value = getattr(event, name)
        if shape == "calls":
            found += [c.arguments_json for c in value if c.arguments_json]
        elif value:
            found.append(value)
    return found
