"""Terminal rendering of a live turn and of a session's timeline, with rich."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from engine import events as ev
from engine.stream import ModelDelta, ModelProgress, StreamItem

STATUS_STYLE = {
    "success": "green",
    "failed": "red",
    "timeout": "red",
    "rejected": "yellow",
    "interrupted": "red",
    "declined": "yellow",
    "cancelled": "yellow",
}


def short(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class LiveRenderer:
    """Prints each stream item as it arrives; answer text streams inline."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._streaming = False

    def __call__(self, item: StreamItem) -> None:
        if isinstance(item, ModelProgress):
            return
        if isinstance(item, ModelDelta):
            if not self._streaming:
                self.console.print("[bold]answer[/]  ", end="")
                self._streaming = True
            self.console.print(item.text, end="", markup=False, highlight=False)
            return
        if self._streaming:
            self.console.print()
            self._streaming = False
        line = self._line(item)
        if line:
            self.console.print(line, highlight=False)

    def _line(self, e: ev.Event) -> str | None:
        if isinstance(e, ev.StateChanged):
            return f"[dim]state[/]   {e.from_state} → [bold]{e.to_state}[/] [dim]({e.cause})[/]"
        if isinstance(e, ev.ModelCallStarted):
            return (
                f"[cyan]model[/]   step {e.step + 1} · {e.model} · {e.message_count} messages, "
                f"{e.tools_offered} tools offered"
            )
        if isinstance(e, ev.ModelCallFinished):
            if e.status != "ok":
                return f"[red]model   step {e.step + 1} failed after {e.latency_ms:.0f} ms: {e.error}[/]"
            return (
                f"[cyan]model[/]   step {e.step + 1} done in {e.latency_ms:.1f} ms · "
                f"{e.input_tokens} in / {e.output_tokens} out tokens · {e.finish_reason}"
            )
        if isinstance(e, ev.ToolCallRequested):
            return f"[magenta]tool[/]    → {e.tool_name} {short(e.arguments_json, 200)}"
        if isinstance(e, ev.ToolCallFinished):
            style = STATUS_STYLE.get(e.status, "white")
            return (
                f"[magenta]tool[/]    ← {e.tool_name} [{style}]{e.status}[/] in {e.elapsed_ms:.1f} ms · "
                f"{short(e.content)}"
            )
        if isinstance(e, ev.LoopGuardTriggered):
            return f"[yellow]guard[/]   {e.guard}: {e.reason}; the model answers without tools"
        if isinstance(e, ev.ApprovalRequested):
            return (
                f"[yellow]approve?[/] {e.tool_name} {short(e.arguments_json, 200)} ({e.sensitivity}) "
                f"· call {e.call_id}"
            )
        if isinstance(e, ev.ApprovalDecided):
            return f"[yellow]decided[/]  {e.call_id}: {e.decision} by {e.actor}"
        if isinstance(e, ev.TurnFinished):
            return (
                f"[bold]turn[/]    finished: {e.reason} · {e.iterations} tool iterations · "
                f"{e.model_calls} model calls · tokens {e.input_tokens} in / {e.output_tokens} out"
            )
        return None


def sessions_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="sessions")
    table.add_column("session", no_wrap=True, min_width=32)
    for col in ("user", "agent", "state", "version", "turns", "messages", "tokens in/out"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["session_id"],
            r["user_id"],
            r["agent_id"],
            r["current_state"] + (" (closed)" if r["closed"] else ""),
            str(r["state_version"]),
            str(r["turns"]),
            str(r["message_count"]),
            f"{r['input_tokens']}/{r['output_tokens']}",
        )
    return table


def print_timeline(
    console: Console,
    session: dict[str, Any],
    messages: list[dict[str, Any]],
    states: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> None:
    console.print(
        f"[bold]session[/] {session['session_id']} · user {session['user_id']} · agent "
        f"{session['agent_id']} · model {session['model_name']} · state [bold]{session['current_state']}[/]"
        f" · v{session['state_version']} · tokens {session['input_tokens']} in"
        f" / {session['output_tokens']} out"
    )
    path = " → ".join([states[0]["from_state"]] + [s["to_state"] for s in states]) if states else "IDLE"
    console.print(f"[bold]state path[/] {path}", highlight=False)
    msg_table = Table(title="messages")
    for col in ("#", "role", "content"):
        msg_table.add_column(col)
    for m in messages:
        content = m["content"]
        if m["tool_calls_json"]:
            calls = json.loads(m["tool_calls_json"])
            content = (content + " " if content else "") + "; ".join(
                f"→ {c['name']}({short(c['arguments'], 80)})" for c in calls
            )
        msg_table.add_row(
            str(m["seq"]), m["role"] + (f" ({m['tool_name']})" if m["tool_name"] else ""), short(content, 300)
        )
    console.print(msg_table)
    tool_table = Table(title="tool calls")
    for col in ("call", "tool", "iteration", "status", "attempts", "elapsed ms", "arguments"):
        tool_table.add_column(col)
    for t in tools:
        style = STATUS_STYLE.get(t["status"], "white")
        elapsed = "" if t["elapsed_time_ms"] is None else f"{t['elapsed_time_ms']:.1f}"
        tool_table.add_row(
            t["call_id"],
            t["tool_name"],
            str(t["iteration"]),
            f"[{style}]{t['status']}[/]",
            str(t["attempts"]),
            elapsed,
            short(t["input_json"], 80),
        )
    console.print(tool_table)
