"""The data lifecycle commands: `erase` (a user's or a session's content), `migrate-encrypt`
(an old embedded log copied with its content encrypted) and `rotate-master-key`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import ReadSide
from .cli_common import (
    AgentsOption,
    HomeOption,
    KafkaOption,
    PartitionsOption,
    PostgresOption,
    SchemaOption,
    TopicOption,
    console,
    run,
)
from .config import home_dir

commands = typer.Typer()


@commands.command()
def erase(
    user: Annotated[str | None, typer.Option("--user", help="Erase every session of this user.")] = None,
    session: Annotated[str | None, typer.Option("--session", help="Erase this session.")] = None,
    reason: Annotated[
        str, typer.Option(help="Why (recorded on the log as metadata: no personal data).")
    ] = "erased by an admin",
    home: HomeOption = None,
    kafka: KafkaOption = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
    postgres: PostgresOption = None,
    schema: SchemaOption = "public",
    agents: AgentsOption = None,
    batch: Annotated[
        int,
        typer.Option(
            min=1, help="Sessions per key-store transaction (what a crash makes the next run redo)."
        ),
    ] = 200,
) -> None:
    """Erase a user's (or one session's) content for good: destroy their keys (the log then reads
    [erased]), stop a running turn, scrub the projections and long-term memories. Metadata stays.
    Durable and idempotent; first finishes any erasure a process left pending (with neither
    --user nor --session, only that)."""
    from . import erase_cli

    if user is not None and session is not None:
        raise typer.BadParameter("give --user or --session, not both")
    if (kafka is None) != (postgres is None):
        raise typer.BadParameter(
            "--kafka and --postgres go together: the log on Kafka, the projections in PostgreSQL"
        )
    side = ReadSide(home_dir(home), kafka, topic, partitions, postgres, schema)
    run(erase_cli.run(console, side, agents=agents, user=user, session=session, reason=reason, batch=batch))


@commands.command(name="migrate-encrypt")
def migrate_encrypt(
    to: Annotated[
        Path | None, typer.Option("--to", help="New folder for the encrypted copy (embedded).")
    ] = None,
    to_topic: Annotated[
        str | None, typer.Option("--to-topic", help="New topic for the encrypted copy (Kafka).")
    ] = None,
    home: HomeOption = None,
    kafka: KafkaOption = None,
    topic: TopicOption = "turnlog.events",
    partitions: PartitionsOption = 8,
) -> None:
    """Copy a log written before encryption into a new one with its content encrypted (every
    event, each session's versions kept), and say what the old one still holds: delete it once
    the copy is in use (an erasure cannot reach it before)."""
    from . import crypto_cli

    side = ReadSide(home_dir(home), kafka, topic, partitions)
    run(crypto_cli.migrate(console, side, to, to_topic))


@commands.command(name="rotate-master-key")
def rotate_master_key(
    home: HomeOption = None,
    kafka: KafkaOption = None,
) -> None:
    """Rotate the master key: every session's data key rewrapped under a new one (the key file's,
    or TURNLOG_MASTER_KEY's with the old in TURNLOG_OLD_MASTER_KEYS); the log is not rewritten."""
    from . import crypto_cli

    side = ReadSide(home_dir(home), kafka)

    async def work() -> int:
        return crypto_cli.rotate(console, side)

    run(work())


@commands.command(name="open-logs")
def open_logs(home: HomeOption = None, kafka: KafkaOption = None) -> None:
    """Read the gateway's JSON log lines on stdin and print them with each sampled context
    (`turn.context`, sealed with its session's key) opened: [erased] once the session is erased."""
    import sys

    from . import crypto_cli

    side = ReadSide(home_dir(home), kafka)

    async def work() -> int:
        return crypto_cli.open_logs(side, sys.stdin, sys.stdout)

    run(work())
