"""The admin commands' work: snapshots, fork, replay (engine.admin) on the embedded app."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from rich.console import Console
from rich.table import Table

from turnlog.engine import events as ev
from turnlog.engine.admin import SessionAdmin, Unfinished
from turnlog.engine.fold import fold

from .app import EmbeddedApp
from .demo import Invocation
from .render import correction, short


async def list_snapshots(console: Console, home: Path, session_id: str, hint: Invocation) -> int:
    app_ = EmbeddedApp(home)
    try:
        await app_.projector.catch_up()
        if app_.store.session(session_id) is None:
            listing = hint.command("sessions")
            console.print(
                f"[red]no session {session_id}[/]; list them with [bold]{listing}[/]", highlight=False
            )
            return 1
        rows = app_.store.rows_of("snapshots", session_id)
        table = Table(title=f"snapshots of {session_id}")
        for col in ("version", "state", "last tool", "turns", "messages", "tokens in/out"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                str(r["version"]),
                r["status"],
                r["last_tool"] or "-",
                str(r["turns"]),
                str(r["message_count"]),
                f"{r['input_tokens']}/{r['output_tokens']}",
            )
        console.print(table)
        if rows:
            example = hint.command("fork", session_id, str(rows[-1]["version"]))
            console.print(f"Fork one (a VERSION above): [bold]{example}[/]", highlight=False)
        return 0
    finally:
        await app_.close()


async def fork(
    console: Console,
    home: Path,
    session_id: str,
    version: int,
    agent: str | None,
    hint: Invocation,
    unfinished: str | None = None,
) -> int:
    app_ = EmbeddedApp(home)
    try:
        admin = SessionAdmin(app_.log, producer="cli")
        choice = cast(Unfinished, unfinished) if unfinished else None
        forked = await admin.fork(session_id, version, agent_id=agent, unfinished=choice)
        state = fold(forked.session_id, await app_.log.read_session(forked.session_id))
        waiting = state.turn is not None or bool(state.inbox)
        go_on = (
            hint.command("continue", forked.session_id)
            if waiting
            else hint.command("continue", forked.session_id, "'your next message'")
        )
        inherited = " It inherited a turn that had not finished; continue finishes it." if waiting else ""
        console.print(
            f"forked {forked.session_id} from {session_id} at v{version} (agent {forked.agent_id}); "
            f"the origin is unchanged.{inherited}\nNext:\n  [bold]{go_on}[/]\n  "
            f"{hint.command('show', forked.session_id)}",
            highlight=False,
            soft_wrap=True,
        )
        return 0
    finally:
        await app_.close()


async def replay(console: Console, home: Path, session_id: str, start: int, end: int | None) -> int:
    app_ = EmbeddedApp(home)
    try:
        admin = SessionAdmin(app_.log)
        async for step in admin.replay(session_id, from_version=start, to_version=end):
            e, s = step.event, step.state
            console.print(
                f"v{e.version:<4} {e.type:<20} {s.status:<15} msgs {len(s.messages):<3} "
                f"tokens {s.input_tokens}/{s.output_tokens}  {_detail(e)}",
                highlight=False,
                markup=False,
            )
        return 0
    finally:
        await app_.close()


def _detail(e: ev.Event) -> str:
    if isinstance(e, ev.StateChanged):
        return f"{e.from_state} -> {e.to_state} ({e.cause}) {short(e.detail, 80)}".rstrip()
    if isinstance(e, (ev.UserMessageReceived, ev.AssistantMessage)):
        calls = getattr(e, "tool_calls", ())
        return short(e.text, 100) + "".join(f" -> {c.name}" for c in calls)
    if isinstance(e, (ev.ToolCallRequested, ev.ToolCallStarted)):
        return e.tool_name
    if isinstance(e, ev.ToolCallFinished):
        return f"{e.tool_name} {e.status}: {short(e.content, 80)}"
    if isinstance(e, ev.SnapshotTaken):
        return f"snapshot of v{e.version - 1}"
    if isinstance(e, ev.SessionForked):
        return f"forked from {e.origin_session_id} v{e.origin_version}"
    if isinstance(e, (ev.TurnFinished, ev.SessionClosed, ev.CancelRequested)):
        return e.reason
    if isinstance(e, ev.ModelCorrected):
        return correction(e)
    if isinstance(e, ev.LoopGuardTriggered):
        return f"{e.guard}: {e.reason}"
    if isinstance(e, ev.ModelFallback):
        cause = " (breaker open)" if e.cause == "breaker_open" else ""
        return f"{e.from_model} -> {e.to_model}{cause}: {short(e.reason, 80)}"
    if isinstance(e, ev.ModelBreakerChanged):
        return f"{e.model} breaker {e.from_state} -> {e.to_state}: {short(e.reason, 80)}"
    if isinstance(e, ev.ModelCallFinished) and e.error:
        return f"{e.status}: {short(e.error, 120)}"
    return ""
