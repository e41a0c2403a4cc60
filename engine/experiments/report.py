"""The experiment report as JSON-ready data (the CLI's --json, the admin route, the viewer page)."""

from __future__ import annotations

from typing import Any

from .compare import ExperimentReport, SessionDiff, TurnDiff


def report_json(report: ExperimentReport, *, all_turns: bool = False) -> dict[str, Any]:
    """Summary, then every session with its divergent turns (every turn with ``all_turns``)."""
    return {
        "experiment_id": report.experiment_id,
        "spec": report.spec,
        "summary": report.summary(),
        "sessions": [session_json(s, all_turns=all_turns) for s in report.sessions],
    }


def session_json(s: SessionDiff, *, all_turns: bool = False) -> dict[str, Any]:
    return {
        "origin_session_id": s.origin_session_id,
        "replay_session_id": s.replay_session_id,
        "agent_original": s.agent_original,
        "agent_replay": s.agent_replay,
        "divergent": s.divergent,
        "complete": s.complete,
        "error": s.error,
        "turns": len(s.turns),
        "divergent_turns": [t.index for t in s.divergent_turns],
        "turn_diffs": [turn_json(t) for t in s.turns if all_turns or t.divergent],
    }


def turn_json(t: TurnDiff) -> dict[str, Any]:
    def pair(values: tuple[float, float]) -> dict[str, float]:
        return {"original": values[0], "replay": values[1], "delta": values[1] - values[0]}

    return {
        "index": t.index,
        "user_text": t.user_text,
        "original_turn_id": t.original_turn_id,
        "replay_turn_id": t.replay_turn_id,
        "replayed": t.replayed,
        "divergent": t.divergent,
        "tool_calls": {
            "added": [{"tool": n, "arguments": a} for n, a in t.added],
            "missing": [{"tool": n, "arguments": a} for n, a in t.missing],
            "changed": [{"tool": n, "original": o, "replay": r} for n, o, r in t.changed],
            "unmatched": [{"tool": n, "arguments": a} for n, a in t.unmatched],
        },
        "answer": {"original": t.answer_original, "replay": t.answer_replay, "similarity": t.similarity},
        "outcome": {
            "original": t.outcome_original,
            "replay": t.outcome_replay,
            "errors_original": t.errors_original,
            "errors_replay": t.errors_replay,
        },
        "input_tokens": pair(t.input_tokens),
        "output_tokens": pair(t.output_tokens),
        "cost_micros": pair(t.cost_micros),
        "model_latency_ms": pair(t.model_latency_ms),
        "wall_ms": pair(t.wall_ms),
    }
