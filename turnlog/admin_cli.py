"""The admin commands' work: snapshots, fork, replay (engine.admin) on the embedded app."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from engine import events as ev
from engine.admin import SessionAdmin

from .app import EmbeddedApp
from .render import short


async def list_snapshots(console: Console, home: Path, session_id: str) -> int:
    app_ = EmbeddedApp(home)
    try:
        await app_.projector.catch_up()
        if app_.store.session(session_id) is None:
            console.print(f"[red]no session {session_id}[/]; list them with [bold]turnlog sessions[/]")
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
            console.print(f"Fork one: [bold]turnlog fork {session_id} VERSION[/]", highlight=False)
        return 0
    finally:
        await app_.close()


async def fork(console: Console, home: Path, session_id: str, version: int, agent: str | None) -> int:
    app_ = EmbeddedApp(home)
    try:
        forked = await SessionAdmin(app_.log, producer="cli").fork(session_id, version, agent_id=agent)
        console.print(
            f"forked {forked.session_id} from {session_id} at v{version} (agent {forked.agent_id}); "
            f"the origin is unchanged.\nNext: [bold]turnlog show {forked.session_id}[/]",
            highlight=False,
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
    return ""
