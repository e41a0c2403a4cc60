"""What a row of each analytics export dataset holds (``turnlog export``): a pure function of one
event and its place on the log.

An export is append-only, so a row is a fact that never changes once written: the event that
states it, and nothing folded from other events (that is the read models' job). So a session is
one row when it starts (``SessionCreated`` or ``SessionForked``), and what happens to it later is
rows of the other datasets, joined on ``session_id``: its turns, messages, model and tool calls
and state changes. A row needs nothing but its event, so the rows for a range of offsets are
the same however the export is cut into runs, which is what makes a resumed export equal to an
uninterrupted one.

Every row starts with the same five columns (``HEAD``): the session, the event's version in it
(with ``session_id`` a row's unique key), the event's time, and the log partition and offset it
came from. Types are named here without importing pyarrow (``consumers/export_files.py`` maps
them), so this module stays importable without the ``export`` extra.

Content (what a person wrote, and what was derived from it: message text, tool results) is in
columns of its own, present only when the export asks for content, and every value of them goes
through ``exported_content``: the one place the data lifecycle (per-user encryption, erasure,
expiry) will decide what an export may hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from turnlog.engine import events as ev
from turnlog.engine.crypto.fields import is_erased
from turnlog.engine.experiments.namespace import is_experiment_session
from turnlog.engine.snapshots import forked_state
from turnlog.engine.tools.guards import Guard

Row = tuple[Any, ...]
GUARDS = frozenset(str(g) for g in Guard)
GUARD_REFUSAL = "loop guard: "
"""How the tool layer's ``error`` names the loop guard that refused a call (engine.tools.batch);
tests/test_export.py checks it on a real guard trip."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    """str | int | float | bool | time (ms since the epoch, UTC)."""
    doc: str = ""


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    columns: tuple[Column, ...]
    """Every column, ``HEAD`` first; the content columns last."""
    content: int = 0
    """How many of the last columns are content (exported only with --content)."""

    def columns_for(self, content: bool) -> tuple[Column, ...]:
        return self.columns if content or not self.content else self.columns[: -self.content]


HEAD = (
    Column("session_id", "str"),
    Column("version", "int", "the event's version in its session; (session_id, version) is unique"),
    Column("time", "time", "when the event was made (UTC); its day names the row's day= folder"),
    Column("log_partition", "int"),
    Column("log_offset", "int"),
)


def _dataset(name: str, *columns: Column, content: int = 0) -> Dataset:
    return Dataset(name, HEAD + columns, content)


S, N, F, B = "str", "int", "float", "bool"
DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        _dataset(
            "sessions",
            Column("agent_id", S),
            Column("user_id", S),
            Column("role", S),
            Column("model", S),
            Column("origin_session_id", S, "a fork's origin (null: a new session)"),
            Column("origin_version", N, "the origin's snapshot a fork starts from"),
            Column("experiment", B, "an experiment's replay (engine.experiments), not production traffic"),
        ),
        _dataset(
            "turns",
            Column("turn_id", S),
            Column("message_id", S, "the user message the turn answered"),
            Column("outcome", S, "TurnFinished.reason: answered, model_error, a guard's name, ..."),
            Column("guard", S, "the loop guard that ended the turn, or null"),
            Column("iterations", N),
            Column("model_calls", N),
            Column("input_tokens", N),
            Column("output_tokens", N),
            Column("cost_micros", N),
        ),
        _dataset(
            "messages",
            Column("message_id", S),
            Column("role", S, "user | assistant | tool"),
            Column("turn_id", S),
            Column("chars", N, "length of the text in characters"),
            Column("tool_calls", N, "calls an assistant message asked for"),
            Column("tool_call_id", S),
            Column("tool_name", S),
            Column("content", S, "the text (only with --content)"),
            content=1,
        ),
        _dataset(
            "model_calls",
            Column("turn_id", S),
            Column("step", N, "the model step in its turn (an engine call: minus its version)"),
            Column("purpose", S, "turn | summary | memory_extraction"),
            Column("model", S, "the model that answered (the backup after a fallback)"),
            Column("status", S, "ok | failed | cancelled | interrupted"),
            Column("input_tokens", N),
            Column("output_tokens", N),
            Column("cached_input_tokens", N),
            Column("cost_micros", N),
            Column("latency_ms", F),
            Column("fallbacks", N, "models left for the next in the agent's chain during the call"),
            Column("fallback", B, "the call was answered (or failed) after at least one fallback"),
            Column("estimated", B, "tokens are the engine's count, not the provider's usage"),
            Column("finish_reason", S),
            Column("error", S),
        ),
        _dataset(
            "tool_calls",
            Column("turn_id", S, "null for a direct invocation"),
            Column("call_id", S),
            Column("tool_name", S),
            Column("status", S, "success | failed | timeout | rejected | interrupted | declined | ..."),
            Column("elapsed_ms", F),
            Column("attempts", N),
            Column("error", S),
            Column("guard", S, "the loop guard that refused the call before it ran, or null"),
            Column("invoked_by", S, "who ran a direct invocation (null inside a turn)"),
            Column("result", S, "what the model was given (only with --content)"),
            content=1,
        ),
        _dataset(
            "state_changes",
            Column("from_state", S),
            Column("to_state", S),
            Column("cause", S),
            Column("detail", S, "why: the error of a model_error, the guard's reason, ..."),
        ),
    )
}


def exported_content(event: ev.Event, text: str) -> str | None:
    """The value a content column holds for ``text`` of ``event``.

    Every content value of an export passes here, and only here: an erased session's content
    (its key destroyed: engine.crypto, the value reads as erased) becomes ``None``, so no
    export written after an erasure holds it, nor a placeholder that could pass for text."""
    return None if is_erased(text) else text


def _id(value: str | None) -> str | None:
    return value or None


def _created(e: ev.SessionCreated, content: bool) -> list[tuple[str, Row]]:
    row = (e.agent_id, e.user_id, e.role, e.model, None, None, is_experiment_session(e.session_id))
    return [("sessions", row)]


def _forked(e: ev.SessionForked, content: bool) -> list[tuple[str, Row]]:
    state = forked_state(e)
    experiment = is_experiment_session(e.session_id)
    row = (e.agent_id, state.user_id, state.role, e.model, e.origin_session_id, e.origin_version, experiment)
    return [("sessions", row)]


def _turn_finished(e: ev.TurnFinished, content: bool) -> list[tuple[str, Row]]:
    guard = e.reason if e.reason in GUARDS else None
    row = (
        e.turn_id, e.message_id, e.reason, guard, e.iterations, e.model_calls,
        e.input_tokens, e.output_tokens, e.cost_micros,
    )  # fmt: skip
    return [("turns", row)]


def _message(e: ev.Event, text: str, row: Row, content: bool) -> tuple[str, Row]:
    return ("messages", (*row, exported_content(e, text)) if content else row)


def _user_message(e: ev.UserMessageReceived, content: bool) -> list[tuple[str, Row]]:
    return [_message(e, e.text, (e.message_id, "user", None, len(e.text), 0, None, None), content)]


def _assistant(e: ev.AssistantMessage, content: bool) -> list[tuple[str, Row]]:
    row = (e.message_id, "assistant", _id(e.turn_id), len(e.text), len(e.tool_calls), None, None)
    return [_message(e, e.text, row, content)]


def _model_finished(e: ev.ModelCallFinished, content: bool) -> list[tuple[str, Row]]:
    row = (
        _id(e.turn_id), e.step, "turn", e.model, e.status, e.input_tokens, e.output_tokens,
        e.cached_input_tokens, e.cost_micros, e.latency_ms, e.retries, e.retries > 0, e.estimated,
        e.finish_reason or None, e.error or None,
    )  # fmt: skip
    return [("model_calls", row)]


def _auxiliary(e: ev.AuxiliaryModelCall, content: bool) -> list[tuple[str, Row]]:
    row = (
        _id(e.turn_id), -e.version, e.purpose, e.model, e.status, e.input_tokens, e.output_tokens,
        e.cached_input_tokens, e.cost_micros, e.latency_ms, 0, False, e.estimated, None, e.error or None,
    )  # fmt: skip
    return [("model_calls", row)]


def guard_of(error: str | None) -> str | None:
    """The loop guard a tool call's ``error`` says refused it, or None."""
    if error and error.startswith(GUARD_REFUSAL):
        name = error[len(GUARD_REFUSAL) :]
        return name if name in GUARDS else None
    return None


def _tool(e: ev.ToolCallFinished | ev.ToolInvoked, turn_id: str | None, by: str | None, content: bool) -> Row:
    row = (
        turn_id, e.call_id, e.tool_name, e.status, e.elapsed_ms, e.attempts, e.error or None,
        guard_of(e.error), by,
    )  # fmt: skip
    return (*row, exported_content(e, e.content)) if content else row


def _tool_finished(e: ev.ToolCallFinished, content: bool) -> list[tuple[str, Row]]:
    message = (e.event_id, "tool", _id(e.turn_id), len(e.content), 0, e.call_id, e.tool_name)
    return [("tool_calls", _tool(e, _id(e.turn_id), None, content)), _message(e, e.content, message, content)]


def _invoked(e: ev.ToolInvoked, content: bool) -> list[tuple[str, Row]]:
    return [("tool_calls", _tool(e, None, e.actor, content))]


def _state_changed(e: ev.StateChanged, content: bool) -> list[tuple[str, Row]]:
    return [("state_changes", (e.from_state, e.to_state, e.cause, e.detail))]


Builder = Callable[[Any, bool], list[tuple[str, Row]]]
BUILDERS: dict[type[ev.Event], Builder] = {
    ev.SessionCreated: _created,
    ev.SessionForked: _forked,
    ev.TurnFinished: _turn_finished,
    ev.UserMessageReceived: _user_message,
    ev.AssistantMessage: _assistant,
    ev.ModelCallFinished: _model_finished,
    ev.AuxiliaryModelCall: _auxiliary,
    ev.ToolCallFinished: _tool_finished,
    ev.ToolInvoked: _invoked,
    ev.StateChanged: _state_changed,
}
"""The events that make rows; every other event (snapshots, starts, context and memory events)
makes none."""


def rows_of(event: ev.Event, partition: int, offset: int, content: bool) -> Sequence[tuple[str, Row]]:
    """The (dataset, row) pairs ``event`` at ``partition``/``offset`` makes, each row in its
    dataset's column order (``HEAD`` first)."""
    build = BUILDERS.get(type(event))
    if build is None:
        return ()
    head = (event.session_id, event.version, event.time_ms, partition, offset)
    return [(name, head + row) for name, row in build(event, content)]
