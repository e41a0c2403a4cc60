"""The `turnlog` command: its options and subcommands, each group in a module of its own
(cli_demo, cli_sessions, cli_services, cli_data, cli_experiment; shared options in cli_common)."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import structlog
import typer

from . import cli_data, cli_demo, cli_experiment, cli_services, cli_sessions

app = typer.Typer(
    help="turnlog: an event-sourced session engine for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
for group in (cli_demo, cli_sessions, cli_services, cli_data):
    app.add_typer(group.commands)
app.add_typer(cli_experiment.experiment_app, name="experiment")


def _show_version(value: bool) -> None:
    if value:
        from .doctor import version_line

        print(version_line())
        raise typer.Exit()


@app.callback()
def _configure(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the engine's own logs.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO if verbose else logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def main() -> None:
    app()
