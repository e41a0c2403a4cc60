"""`turnlog experiment run / resume / report / list` (the work is in experiment_cli.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from .cli_common import ApiKeyOption, BaseUrlOption, HomeOption, ModelOption, console, run
from .config import ModelSettings, home_dir

experiment_app = typer.Typer(
    help="Replay recorded sessions against a changed agent and report what changes.", no_args_is_help=True
)
CandidateOption = Annotated[
    str,
    typer.Option(
        "--candidate",
        help="The candidate agents, as --agents names agents: package.module:attribute "
        "(an AgentDirectory or a function returning one).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]


@experiment_app.command(name="run")
def experiment_run(
    candidate: CandidateOption,
    home: HomeOption = None,
    agent: Annotated[
        str | None, typer.Option(help="The candidate agent (default: the one with each session's agent id).")
    ] = None,
    select_agent: Annotated[
        str | None, typer.Option("--select-agent", help="Only sessions of this agent.")
    ] = None,
    user: Annotated[str | None, typer.Option(help="Only sessions of this user.")] = None,
    since: Annotated[str | None, typer.Option(help="Only sessions created at or after (ISO, UTC).")] = None,
    until: Annotated[str | None, typer.Option(help="Only sessions created before (ISO, UTC).")] = None,
    session: Annotated[list[str] | None, typer.Option("--session", help="Exactly these sessions.")] = None,
    sample: Annotated[int | None, typer.Option(help="A random sample of N of the matching sessions.")] = None,
    seed: Annotated[int, typer.Option(help="The sample's random seed.")] = 0,
    from_turn: Annotated[
        int, typer.Option(help="Replay from the snapshot at the end of turn N (0: from the start).")
    ] = 0,
    from_version: Annotated[
        int | None, typer.Option(help="Replay from this snapshot version (one --session only).")
    ] = None,
    live: Annotated[
        list[str] | None,
        typer.Option("--live", help="An idempotent tool that may run live when the recording has no match."),
    ] = None,
    live_all: Annotated[bool, typer.Option("--live-all", help="Every idempotent tool may run live.")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Sessions replayed at once.")] = 8,
    name: Annotated[str, typer.Option(help="A name to list the experiment by.")] = "",
    as_json: JsonOption = False,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
) -> None:
    """Replay the selected sessions' user messages against the candidate agent; tools answer from
    the recording. Prints what differs per turn and overall."""
    from . import experiment_cli as x

    selection = x.selection_of(select_agent, user, since, until, session or [], sample, seed)
    options = x.RunOptions(
        candidate,
        agent,
        from_turn,
        from_version,
        True if live_all else (live or []),
        concurrency,
        name,
        as_json,
    )
    settings = ModelSettings.from_env(base_url, api_key, model)
    run(x.run(console, home_dir(home), selection, options, settings))


@experiment_app.command(name="resume")
def experiment_resume(
    experiment_id: str,
    home: HomeOption = None,
    candidate: Annotated[
        str | None, typer.Option("--candidate", help="The candidate agents (default: those it was run with).")
    ] = None,
    as_json: JsonOption = False,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
) -> None:
    """Carry on an experiment that was stopped: sessions already replayed are not replayed again."""
    from . import experiment_cli as x

    settings = ModelSettings.from_env(base_url, api_key, model)
    run(x.resume(console, home_dir(home), experiment_id, candidate, settings, as_json))


@experiment_app.command(name="report")
def experiment_report(
    experiment_id: str,
    home: HomeOption = None,
    as_json: JsonOption = False,
    all_turns: Annotated[
        bool, typer.Option("--all-turns", help="Every turn, not only those that differ.")
    ] = False,
) -> None:
    """The experiment's report, made again from the log."""
    from . import experiment_cli as x

    run(x.report(console, home_dir(home), experiment_id, as_json, all_turns))


@experiment_app.command(name="list")
def experiment_list(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The experiments on the log."""
    from . import experiment_cli as x

    run(x.list_all(console, home_dir(home), as_json))
