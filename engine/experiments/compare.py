"""What changed between a recorded session and its replay: per turn, the tool calls (added,
missing, different arguments, calls the recording could not answer), the final answer (a
similarity score and both texts), the outcome (answered, error, loop guard, budget stop,
iteration cap ...), and the token, cost and latency differences; then the same over a whole
experiment. Everything is read from the two sessions' events, so a report can be made again at
any time."""

from __future__ import annotations

import difflib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .recording import RecordedCall, RecordedTurn, Recording, canonical_arguments
from .tool_server import UNMATCHED_ERROR

ToolCall = tuple[str, str]
"""(tool name, canonical arguments)."""


@dataclass
class TurnDiff:
    index: int
    """The turn's position among the turns replayed (0 first)."""
    user_text: str
    original_turn_id: str
    replay_turn_id: str = ""
    added: list[ToolCall] = field(default_factory=list)
    missing: list[ToolCall] = field(default_factory=list)
    changed: list[tuple[str, str, str]] = field(default_factory=list)
    """(tool, recorded arguments, replayed arguments): the same tool called with others."""
    unmatched: list[ToolCall] = field(default_factory=list)
    """Calls the recording could not answer and that were not run (each a divergence)."""
    answer_original: str = ""
    answer_replay: str = ""
    similarity: float = 1.0
    outcome_original: str = ""
    outcome_replay: str = ""
    errors_original: list[str] = field(default_factory=list)
    errors_replay: list[str] = field(default_factory=list)
    input_tokens: tuple[int, int] = (0, 0)
    output_tokens: tuple[int, int] = (0, 0)
    cost_micros: tuple[int, int] = (0, 0)
    model_latency_ms: tuple[float, float] = (0.0, 0.0)
    wall_ms: tuple[int, int] = (0, 0)
    replayed: bool = True

    @property
    def tool_calls_differ(self) -> bool:
        return bool(self.added or self.missing or self.changed or self.unmatched)

    @property
    def answer_differs(self) -> bool:
        return self.answer_original != self.answer_replay

    @property
    def outcome_differs(self) -> bool:
        return self.outcome_original != self.outcome_replay

    @property
    def divergent(self) -> bool:
        return not self.replayed or self.tool_calls_differ or self.answer_differs or self.outcome_differs


@dataclass
class SessionDiff:
    origin_session_id: str
    replay_session_id: str
    agent_original: str
    agent_replay: str
    turns: list[TurnDiff]
    error: str = ""
    """Why the replay could not run (it is then divergent)."""

    @property
    def divergent_turns(self) -> list[TurnDiff]:
        return [t for t in self.turns if t.divergent]

    @property
    def divergent(self) -> bool:
        return bool(self.error) or bool(self.divergent_turns)

    @property
    def complete(self) -> bool:
        return not self.error and all(t.replayed for t in self.turns)


def compare_session(
    original: Recording, planned: list[RecordedTurn], replay: Recording | None, error: str = ""
) -> SessionDiff:
    """``planned`` (the recorded turns the replay was to replay) against the replay's turns."""
    done = replay.turns if replay is not None else []
    turns = [
        _turn(i, turn, done[i] if i < len(done) and done[i].finished else None)
        for i, turn in enumerate(planned)
    ]
    return SessionDiff(
        original.session_id,
        replay.session_id if replay is not None else "",
        original.agent_id,
        replay.agent_id if replay is not None else "",
        turns,
        error,
    )


def _outcome(turn: RecordedTurn) -> str:
    """How the turn ended, with the loop guards that tripped on the way (a guard that only
    corrected the model is an outcome too: the turn went another way)."""
    guards = [g for g in dict.fromkeys(turn.guards) if g != turn.reason]
    return f"{turn.reason} after {', '.join(guards)}" if guards else turn.reason


def _turn(index: int, original: RecordedTurn, replay: RecordedTurn | None) -> TurnDiff:
    diff = TurnDiff(index, original.text, original.turn_id)
    diff.answer_original, diff.outcome_original = original.answer, _outcome(original)
    diff.errors_original = list(original.errors)
    if replay is None:
        diff.replayed, diff.similarity = False, 0.0
        return diff
    diff.replay_turn_id = replay.turn_id
    diff.added, diff.missing, diff.changed = call_changes(original.calls, replay.calls)
    diff.unmatched = [
        (c.tool_name, canonical_arguments(c.arguments_json))
        for c in replay.calls
        if (c.error or "").startswith(UNMATCHED_ERROR)
    ]
    diff.answer_replay, diff.outcome_replay = replay.answer, _outcome(replay)
    diff.errors_replay = list(replay.errors)
    diff.similarity = similarity(original.answer, replay.answer)
    diff.input_tokens = (original.input_tokens, replay.input_tokens)
    diff.output_tokens = (original.output_tokens, replay.output_tokens)
    diff.cost_micros = (original.cost_micros, replay.cost_micros)
    diff.model_latency_ms = (round(original.model_latency_ms, 3), round(replay.model_latency_ms, 3))
    diff.wall_ms = (original.wall_ms, replay.wall_ms)
    return diff


def call_changes(
    original: list[RecordedCall], replay: list[RecordedCall]
) -> tuple[list[ToolCall], list[ToolCall], list[tuple[str, str, str]]]:
    """(added, missing, changed): calls as multisets of (tool, arguments); an added and a missing
    call of the same tool pair up, in order, as a call with other arguments."""
    left = [c.key for c in original]
    added: list[ToolCall] = []
    for key in (c.key for c in replay):
        if key in left:
            left.remove(key)
        else:
            added.append(key)
    missing = left
    by_tool: dict[str, list[ToolCall]] = defaultdict(list)
    for key in missing:
        by_tool[key[0]].append(key)
    changed: list[tuple[str, str, str]] = []
    still_added: list[ToolCall] = []
    for key in added:
        if by_tool[key[0]]:
            before = by_tool[key[0]].pop(0)
            changed.append((key[0], before[1], key[1]))
        else:
            still_added.append(key)
    still_missing = [k for calls in by_tool.values() for k in calls]
    return still_added, still_missing, changed


def similarity(a: str, b: str) -> float:
    """0..1, 1 for equal texts (difflib's ratio of matching characters)."""
    if a == b:
        return 1.0
    return round(difflib.SequenceMatcher(None, a, b, autojunk=False).ratio(), 4)


@dataclass
class ExperimentReport:
    experiment_id: str
    spec: dict[str, Any]
    sessions: list[SessionDiff]

    @property
    def divergent_sessions(self) -> list[SessionDiff]:
        return [s for s in self.sessions if s.divergent]

    def summary(self) -> dict[str, Any]:
        return summarize(self.sessions)


def summarize(sessions: list[SessionDiff]) -> dict[str, Any]:
    turns = [t for s in sessions for t in s.turns]
    replayed = [t for t in turns if t.replayed]

    def total(name: str, side: int) -> float:
        return sum(getattr(t, name)[side] for t in replayed)

    deltas = {
        name: {"original": total(name, 0), "replay": total(name, 1), "delta": total(name, 1) - total(name, 0)}
        for name in ("input_tokens", "output_tokens", "cost_micros", "model_latency_ms", "wall_ms")
    }
    return {
        "sessions": len(sessions),
        "sessions_complete": sum(1 for s in sessions if s.complete),
        "sessions_divergent": sum(1 for s in sessions if s.divergent),
        "turns": len(turns),
        "turns_replayed": len(replayed),
        "turns_divergent": sum(1 for t in turns if t.divergent),
        "turns_tool_calls_differ": sum(1 for t in replayed if t.tool_calls_differ),
        "calls_added": sum(len(t.added) for t in replayed),
        "calls_missing": sum(len(t.missing) for t in replayed),
        "calls_changed": sum(len(t.changed) for t in replayed),
        "calls_unmatched": sum(len(t.unmatched) for t in replayed),
        "answers_differ": sum(1 for t in replayed if t.answer_differs),
        "outcomes_differ": sum(1 for t in replayed if t.outcome_differs),
        "mean_similarity": round(sum(t.similarity for t in replayed) / len(replayed), 4)
        if replayed
        else None,
        **deltas,
    }
