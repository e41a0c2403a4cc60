"""What the encryption and erasure tests share: events with a unique string planted in every
content field, a PostgreSQL key store in a fresh schema, and raw scans of storage."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import psycopg
from psycopg import sql as pgsql

from turnlog.engine import events as ev
from turnlog.engine.crypto.cipher import ContentCipher
from turnlog.engine.crypto.fields import CONTENT
from turnlog.engine.crypto.keystore_postgres import PostgresKeyStore
from turnlog.engine.crypto.master import MasterKey, MasterKeys

REQUIRED: dict[str, dict[str, object]] = {
    "SessionCreated": {"agent_id": "a", "user_id": "u"},
    "UserMessageReceived": {"message_id": "m1"},
    "ModelCorrected": {"turn_id": "t", "step": 0, "attempt": 1, "kind": "unreadable_call"},
    "AssistantMessage": {"turn_id": "t", "message_id": "m2"},
    "ToolCallRequested": {"turn_id": "t", "call_id": "c", "tool_name": "lookup", "iteration": 1},
    "ToolCallFinished": {"turn_id": "t", "call_id": "c", "tool_name": "lookup", "status": "success"},
    "ApprovalRequested": {"turn_id": "t", "call_id": "c", "tool_name": "lookup", "sensitivity": "high"},
    "ApprovalDecided": {"turn_id": "t", "call_id": "c", "decision": "edited"},
    "ToolInvoked": {"call_id": "c", "tool_name": "lookup", "actor": "u", "status": "success"},
    "SnapshotTaken": {
        **{"state_format": 6, "status": "IDLE", "last_tool": "", "turns": 0, "input_tokens": 0},
        **{"output_tokens": 0, "message_count": 0, "keyframe_version": 0},
    },
    "SessionForked": {
        "origin_session_id": "o",
        "origin_version": 3,
        "agent_id": "a",
        "model": "m",
        "state_format": 6,
    },
    "ContextTrimmed": {
        "turn_id": "t",
        "step": 0,
        "history_tokens_before": 1,
        "history_tokens_after": 1,
        "history_budget": 1,
    },
    "HistorySummarized": {
        "turn_id": "t",
        "step": 0,
        "removed_refs_json": "[]",
        "summarizer": "m",
        "reason": "tokens",
    },
    "HistoryRecalled": {"turn_id": "t", "refs_json": "[]"},
    "MemoriesRetrieved": {"turn_id": "t"},
    "MemoryNoted": {"turn_id": "t", "call_id": "c", "user_id": "u", "tag": "preference"},
    "TaskStateChanged": {"turn_id": "t", "call_id": "c", "op": "set"},
    "BudgetDecided": {"turn_id": "t", "decision": "raise"},
}
"""The other fields each content-bearing event type needs."""


def planted(session_id: str, marker: str) -> list[ev.Event]:
    """One event of every type with content, at versions 1, 2, ... (not a foldable session: for
    the log's codec path), each content field holding ``<marker>-<type>-<field>``."""
    out: list[ev.Event] = []
    for version, (name, fields) in enumerate(CONTENT.items(), start=1):
        values = dict(REQUIRED[name])
        for field, shape in fields.items():
            text = f"{marker}-{name}-{field}"
            if shape == "calls":
                values[field] = (ev.ToolCallSpec("c", "lookup", f'{{"q": "{text}"}}'),)
            else:
                values[field] = text
        out.append(ev.EVENT_TYPES[name](session_id=session_id, version=version, **values))
    return out


def markers_of(events: Iterable[ev.Event], marker: str) -> set[str]:
    """The planted strings ``events`` hold (tool call arguments included)."""
    found: set[str] = set()
    for event in events:
        for value in dataclasses.asdict(event).values():
            text = str(value)
            start = text.find(marker)
            while start >= 0:
                end = start + len(marker)
                while end < len(text) and (text[end].isalnum() or text[end] in "-_"):
                    end += 1
                found.add(text[start:end])
                start = text.find(marker, end)
    return found


def hits(paths: Iterable[Path], needles: Iterable[str]) -> dict[str, list[str]]:
    """Each needle found in the raw bytes of the files (and folders) named, with where."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file()]
        elif path.exists():
            files.append(path)
    blobs = {str(f): f.read_bytes() for f in files}
    found: dict[str, list[str]] = {}
    for needle in needles:
        where = [name for name, blob in blobs.items() if needle.encode() in blob]
        if where:
            found[needle] = where
    return found


def random_master() -> MasterKeys:
    return MasterKeys(MasterKey.from_bytes(os.urandom(32)))


@contextlib.contextmanager
def pg_cipher(dsn: str, master: MasterKeys | None = None) -> Iterator[ContentCipher]:
    """A content cipher on a PostgreSQL key store in a fresh schema (dropped after)."""
    schema = f"keys_{uuid.uuid4().hex[:12]}"
    store = PostgresKeyStore(dsn, schema=schema)
    try:
        yield ContentCipher(store, master or random_master(), recheck_s=0)
    finally:
        store.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)))
