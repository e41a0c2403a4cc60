"""`turnlog erase`: erase a user's or a session's content (engine.erasure), on the embedded log
or on Kafka + PostgreSQL, finishing first whatever erasure a process left pending."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from turnlog.consumers.projector import Projector
from turnlog.engine.erasure import ErasureReport
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.session import AgentSessions
from turnlog.projections.erasure import open_eraser

from .agents import AgentContext, deployed_agents
from .app import ReadSide
from .config import ModelSettings
from .runtime import close_agents


async def run(
    console: Console,
    side: ReadSide,
    *,
    agents: str | None,
    user: str | None,
    session: str | None,
    reason: str,
    batch: int,
) -> int:
    """Resume pending erasures, then erase ``user`` or ``session`` (if given); print what was done."""
    directory = deployed_agents(agents, AgentContext(side.home, ModelSettings.from_env(), "erase"))
    log, store = await side.open(owner=False)
    try:
        api = AgentSessions(log, directory, producer="cli")
        if side.kafka is None:
            await Projector(log, store).catch_up()  # the user's sessions the projections know, too
        eraser = open_eraser(api, store, batch=batch)
        if eraser is None:
            raise ConfigurationError(
                "this log does not encrypt content, so nothing can be erased: set TURNLOG_KEYSTORE "
                "(a PostgreSQL DSN) and a master key (TURNLOG_MASTER_KEY or TURNLOG_MASTER_KEY_FILE) in "
                "every process of the Kafka deployment"
            )
        for report in await eraser.resume():
            _print(console, report, "resumed")
        if user is not None:
            _print(console, await eraser.erase_user(user, reason, actor="cli"), "erased")
        elif session is not None:
            _print(console, await eraser.erase_session(session, reason, actor="cli"), "erased")
        return 0
    finally:
        store.close()
        await log.close()
        await close_agents(directory)


def _print(console: Console, report: ErasureReport, what: str) -> None:
    if not report.sessions:
        console.print(f"nothing left to erase for {report.scope} {escape(report.subject)}", highlight=False)
        return
    done = "already erased" if not report.erased_now else f"{report.erased_now} now"
    console.print(
        f"{what} {report.scope} {escape(report.subject)}: {report.sessions} session(s) ({done}), "
        f"erasure {report.erasure_id}",
        highlight=False,
        soft_wrap=True,
    )
    if report.unerasable:
        console.print(
            f"[yellow]{len(report.unerasable)} session(s) were written before encryption[/]: their keys "
            "are marked erased, but their log records keep plaintext until the log is copied with "
            "`turnlog migrate-encrypt` (embedded) or its topic is deleted (Kafka): "
            + ", ".join(report.unerasable[:10]),
            highlight=False,
        )
