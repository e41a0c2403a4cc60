"""Structured logs derived from the event stream (seed §7.4): one line per model call, state
transition and tool execution, with sizes, statuses and durations, never full argument or result
values. A configurable share of turns (``sample_rate``, opt-in: 0 by default, the seed's 1 % is
0.01) logs its full context, redacted, marked ``sampled=true``; the choice is a hash of the turn
id, so a replay samples the same turns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from typing import Any, TextIO

import structlog

from turnlog.engine import events as ev
from turnlog.engine.fold import SessionState
from turnlog.engine.log.sealing import PLAIN, RecordCodec

from .redact import redact, redact_processor, summary

logger = structlog.get_logger("turnlog.events")


def configure_json_logs(stream: TextIO = sys.stderr, level: int = logging.INFO) -> None:
    """Route structlog to JSON lines with secrets redacted (what ``turnlog serve`` uses). The
    redaction runs before the level and time stamp are added: they hold no secret, and a time
    stamp, new on every line, would miss the redaction's memo and run every pattern."""
    structlog.configure(
        processors=[
            redact_processor,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
    )


def sampled(turn_id: str, rate: float) -> bool:
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    bucket = int.from_bytes(hashlib.blake2b(turn_id.encode(), digest_size=8).digest(), "big") / 2**64
    return bucket < rate


class EventLogger:
    """Turns log events into log lines; remembers just enough (argument sizes, session model)."""

    def __init__(self, sample_rate: float = 0.0) -> None:
        if not 0 <= sample_rate <= 1:
            raise ValueError(f"sample_rate must be between 0 and 1, not {sample_rate}")
        self.sample_rate = sample_rate
        self._argument_bytes: dict[tuple[str, str], tuple[int, list[str]]] = {}
        self.session_models: dict[str, str] = {}

    def wants_context(self, event: ev.Event) -> bool:
        return isinstance(event, ev.TurnFinished) and sampled(event.turn_id, self.sample_rate)

    def log(self, event: ev.Event) -> None:
        if isinstance(event, ev.SessionCreated):
            self.session_models[event.session_id] = event.model
        elif isinstance(event, ev.ToolCallRequested):
            self._argument_bytes[(event.session_id, event.call_id)] = _argument_shape(event.arguments_json)
        elif isinstance(event, ev.ModelCallFinished):
            self._model_call(event)
        elif isinstance(event, ev.StateChanged):
            logger.info(
                "state.transition",
                session_id=event.session_id,
                version=event.version,
                from_state=event.from_state,
                to_state=event.to_state,
                cause=event.cause,
                detail=summary(event.detail, 200),
            )
        elif isinstance(event, ev.ToolCallFinished):
            self._tool_call(event)
        elif isinstance(event, ev.TurnFinished):
            logger.info(
                "turn.finished",
                session_id=event.session_id,
                turn_id=event.turn_id,
                reason=event.reason,
                iterations=event.iterations,
                model_calls=event.model_calls,
                input_tokens=event.input_tokens,
                output_tokens=event.output_tokens,
            )

    def _model_call(self, event: ev.ModelCallFinished) -> None:
        primary = self.session_models.get(event.session_id, event.model)
        logger.info(
            "model.call",
            session_id=event.session_id,
            turn_id=event.turn_id,
            step=event.step,
            model=event.model,
            fallback=event.model != primary,
            status=event.status,
            input_tokens=event.input_tokens,
            output_tokens=event.output_tokens,
            latency_ms=round(event.latency_ms, 1),
            retries=event.retries,
            finish_reason=event.finish_reason,
            error=summary(event.error, 200) if event.error else None,
        )

    def _tool_call(self, event: ev.ToolCallFinished) -> None:
        size, keys = self._argument_bytes.pop((event.session_id, event.call_id), (0, []))
        logger.info(
            "tool.execution",
            session_id=event.session_id,
            turn_id=event.turn_id,
            call_id=event.call_id,
            tool=event.tool_name,
            argument_bytes=size,
            argument_keys=keys,
            status=event.status,
            result_bytes=len(event.content.encode()) + len((event.output_json or "").encode()),
            summary=result_shape(event.content, event.output_json),
            elapsed_ms=round(event.elapsed_ms, 1),
            attempts=event.attempts,
            timeout=event.status == "timeout",
        )

    def log_context(self, event: ev.TurnFinished, state: SessionState, records: RecordCodec = PLAIN) -> None:
        """The sampled full context of a turn: every message, secrets redacted; sealed with the
        session's key when the log encrypts content (``records``): a log line outlives an
        erasure, the key does not. ``open_context`` (``turnlog open-logs``) reads it back."""
        messages: list[dict[str, Any]] = [
            {
                "role": m.role,
                "content": m.content,
                "tool_calls": [{"name": c.name, "arguments": c.arguments_json} for c in m.tool_calls],
                "tool_name": m.name,
            }
            for m in state.messages
        ]
        shown: dict[str, Any] = {"messages": redact(messages)}
        if records.sealer is not None:
            text = json.dumps(shown["messages"], ensure_ascii=False)
            shown = {
                "messages_sealed": records.seal_text(event.session_id, text, _context_label(event.turn_id))
            }
        logger.info(
            "turn.context",
            sampled=True,
            sample_rate=self.sample_rate,
            session_id=event.session_id,
            turn_id=event.turn_id,
            agent_id=state.agent_id,
            model=state.model,
            **shown,
        )


def open_context(line: dict[str, Any], records: RecordCodec) -> dict[str, Any]:
    """A ``turn.context`` log line with its sealed messages opened (``[erased]`` once the
    session's key is gone); any other line as it is."""
    sealed = line.get("messages_sealed")
    if line.get("event") != "turn.context" or not isinstance(sealed, str):
        return line
    text = records.open_text(str(line["session_id"]), sealed, _context_label(str(line["turn_id"])))
    opened = {k: v for k, v in line.items() if k != "messages_sealed"}
    try:
        opened["messages"] = json.loads(text)
    except json.JSONDecodeError:  # erased: "[erased]"
        opened["messages"] = text
    return opened


def _context_label(turn_id: str) -> str:
    return f"turn.context/{turn_id}"


def result_shape(content: str, output_json: str | None) -> str:
    """What a result looks like, without any of its content: a log line outlives an erasure
    (docs/architecture.md, "Data lifecycle"), so it says only the shape (an object's field
    names, a list's length, a text's size); the result itself is on the log, encrypted."""
    if output_json:
        try:
            parsed = json.loads(output_json)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return "object {" + ", ".join(sorted(str(k) for k in parsed)[:12]) + "}"
        if isinstance(parsed, list):
            return f"list of {len(parsed)}"
    lines = content.count("\n") + 1 if content else 0
    return f"text, {len(content)} chars, {lines} line{'s' if lines != 1 else ''}"


def _argument_shape(arguments_json: str) -> tuple[int, list[str]]:
    """Size of the arguments and their top-level names; never their values."""
    try:
        parsed = json.loads(arguments_json)
    except json.JSONDecodeError:
        parsed = None
    keys = sorted(str(k) for k in parsed) if isinstance(parsed, dict) else []
    return len(arguments_json.encode()), keys
