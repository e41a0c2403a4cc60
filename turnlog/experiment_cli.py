"""`turnlog experiment run|resume|report|list`: experiments (engine.experiments) on the embedded
log, with candidate agents loaded like --agents, and the report as a terminal table or JSON."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from turnlog.engine.agent import AgentDirectory
from turnlog.engine.errors import InputError
from turnlog.engine.experiments import (
    ExperimentRunner,
    ExperimentSpec,
    Selection,
    list_experiments,
    load_spec,
)
from turnlog.engine.experiments.compare import ExperimentReport
from turnlog.engine.experiments.report import report_json

from .agents import AgentContext, AgentsTarget, load_agents
from .app import EmbeddedApp
from .config import ModelSettings
from .render import short


@dataclass(frozen=True)
class RunOptions:
    candidate: str
    agent: str | None
    from_turn: int
    from_version: int | None
    live: list[str] | bool
    concurrency: int
    name: str
    as_json: bool


def selection_of(
    agent: str | None,
    user: str | None,
    since: str | None,
    until: str | None,
    ids: list[str],
    sample: int | None,
    seed: int,
) -> Selection:
    return Selection(agent, user, _ms(since, "--since"), _ms(until, "--until"), tuple(ids), sample, seed)


def _ms(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InputError(
            f"{option} takes an ISO date or time such as 2026-11-30 or 2026-11-30T08:00, not {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def candidates(home: Path, target: str, settings: ModelSettings) -> AgentDirectory:
    return load_agents(AgentsTarget(target, "--candidate"), AgentContext(home, settings, "experiment"))


async def run(
    console: Console, home: Path, selection: Selection, options: RunOptions, settings: ModelSettings
) -> int:
    app_ = EmbeddedApp(home)
    try:
        runner = ExperimentRunner(app_.log, candidates(home, options.candidate, settings))
        spec = await runner.define(
            selection,
            candidate=options.candidate,
            agent_id=options.agent,
            from_turn=options.from_turn,
            from_version=options.from_version,
            live=options.live,
            concurrency=options.concurrency,
            name=options.name,
            actor="cli",
        )
        if not options.as_json:
            console.print(
                f"experiment [bold]{spec.experiment_id}[/]: {len(spec.sessions)} sessions against "
                f"{spec.candidate} (if stopped: `turnlog experiment resume {spec.experiment_id}`)",
                highlight=False,
            )
        report = await _run_with_progress(console, runner, spec, options.as_json)
        return show(console, report, options.as_json)
    finally:
        await app_.close()


async def resume(
    console: Console,
    home: Path,
    experiment_id: str,
    candidate: str | None,
    settings: ModelSettings,
    as_json: bool,
) -> int:
    app_ = EmbeddedApp(home)
    try:
        spec = await load_spec(app_.log, experiment_id)
        runner = ExperimentRunner(app_.log, candidates(home, candidate or spec.candidate, settings))
        return show(console, await _run_with_progress(console, runner, spec, as_json), as_json)
    finally:
        await app_.close()


async def _run_with_progress(
    console: Console, runner: ExperimentRunner, spec: ExperimentSpec, quiet: bool
) -> ExperimentReport:
    if quiet:
        return await runner.run(spec)
    columns = (TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("", total=len(spec.sessions))
        skipped = 0

        def advance(p: Any) -> None:
            nonlocal skipped
            skipped += int(p.skipped)
            bar.update(task, completed=p.done, description=f"({skipped} done before)" if skipped else "")

        runner.on_progress = advance
        return await runner.run(spec)


async def report(console: Console, home: Path, experiment_id: str, as_json: bool, all_turns: bool) -> int:
    app_ = EmbeddedApp(home)
    try:
        spec = await load_spec(app_.log, experiment_id)
        return show(console, await ExperimentRunner(app_.log).report(spec), as_json, all_turns)
    finally:
        await app_.close()


async def list_all(console: Console, home: Path, as_json: bool) -> int:
    app_ = EmbeddedApp(home)
    try:
        specs = await list_experiments(app_.log)
    finally:
        await app_.close()
    if as_json:
        print(json.dumps([json.loads(s.to_json()) for s in specs], indent=2))
        return 0
    table = Table(title="experiments")
    for col in ("id", "created (UTC)", "sessions", "candidate", "agent", "from", "name"):
        table.add_column(col)
    for s in specs:
        created = dt.datetime.fromtimestamp(s.created_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")
        start = (
            f"v{s.from_version}" if s.from_version else (f"turn {s.from_turn}" if s.from_turn else "start")
        )
        table.add_row(
            s.experiment_id, created, str(len(s.sessions)), s.candidate, s.agent_id or "(same)", start, s.name
        )
    console.print(table)
    return 0


def show(console: Console, report_: ExperimentReport, as_json: bool, all_turns: bool = False) -> int:
    """Print the report; exit code 0 (the report is the result, divergences included)."""
    if as_json:
        print(json.dumps(report_json(report_, all_turns=all_turns), indent=2, ensure_ascii=False))
        return 0
    console.print(summary_table(report_))
    turns = turns_table(report_, all_turns)
    if turns.row_count:
        console.print(turns)
    answers = answers_table(report_)
    if answers.row_count:
        console.print(answers)
    return 0


def summary_table(report_: ExperimentReport) -> Table:
    s = report_.summary()
    table = Table(title=f"experiment {report_.experiment_id}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("sessions (complete)", f"{s['sessions']} ({s['sessions_complete']})"),
        ("sessions divergent", str(s["sessions_divergent"])),
        ("turns replayed / divergent", f"{s['turns_replayed']} / {s['turns_divergent']}"),
        ("turns whose tool calls differ", str(s["turns_tool_calls_differ"])),
        (
            "calls added / missing / other arguments",
            f"{s['calls_added']} / {s['calls_missing']} / {s['calls_changed']}",
        ),
        ("calls not in the recording (not run)", str(s["calls_unmatched"])),
        ("answers differ (mean similarity)", f"{s['answers_differ']} ({s['mean_similarity']})"),
        ("outcomes differ", str(s["outcomes_differ"])),
    ]
    for name in ("input_tokens", "output_tokens", "cost_micros", "model_latency_ms", "wall_ms"):
        d = s[name]
        rows.append(
            (name.replace("_", " "), f"{_num(d['original'])} -> {_num(d['replay'])} ({_signed(d['delta'])})")
        )
    for row in rows:
        table.add_row(*row)
    return table


def turns_table(report_: ExperimentReport, all_turns: bool) -> Table:
    table = Table(title="turns that differ" if not all_turns else "turns")
    for col in ("session", "turn", "tool calls", "answer", "outcome", "tokens in/out Δ", "latency Δ ms"):
        table.add_column(col)
    for s in report_.sessions:
        if s.error:
            table.add_row(s.origin_session_id[:12], "-", f"[red]{short(s.error, 60)}[/]", "", "", "", "")
        for t in s.turns:
            if not (all_turns or t.divergent):
                continue
            calls = (
                "; ".join(
                    [f"+{n}" for n, _ in t.added]
                    + [f"-{n}" for n, _ in t.missing]
                    + [f"~{n}" for n, _, _ in t.changed]
                    + [f"!{n} not run" for n, _ in t.unmatched]
                )
                or "same"
            )
            outcome = (
                t.outcome_original
                if not t.outcome_differs
                else f"{t.outcome_original} -> {t.outcome_replay or '?'}"
            )
            table.add_row(
                s.origin_session_id[:12],
                str(t.index) if t.replayed else f"{t.index} (not replayed)",
                calls,
                "same" if not t.answer_differs else f"{t.similarity:.2f}",
                outcome,
                f"{_delta(t.input_tokens)}/{_delta(t.output_tokens)}",
                _signed(t.model_latency_ms[1] - t.model_latency_ms[0]),
            )
    return table


def answers_table(report_: ExperimentReport, limit: int = 5) -> Table:
    """The first ``limit`` differing answers, recorded and replayed side by side."""
    table = Table(title="answers that differ (recorded | replayed)")
    table.add_column("session / turn")
    table.add_column("recorded", ratio=1)
    table.add_column("replayed", ratio=1)
    shown = 0
    for s in report_.sessions:
        for t in s.turns:
            if t.replayed and t.answer_differs and shown < limit:
                shown += 1
                table.add_row(f"{s.origin_session_id[:12]} / {t.index}", t.answer_original, t.answer_replay)
    return table


def _num(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _signed(value: float) -> str:
    return ("+" if value > 0 else "") + _num(value)


def _delta(pair: tuple[float, float]) -> str:
    return _signed(pair[1] - pair[0])
