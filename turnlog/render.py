"""Terminal rendering of a live turn and of a session's timeline, with rich."""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from turnlog.engine import events as ev
from turnlog.engine.stream import ModelDelta, ModelProgress, ModelWaiting, StreamItem

STATUS_STYLE = {
    "success": "green",
    "failed": "red",
    "timeout": "red",
    "rejected": "yellow",
    "interrupted": "red",
    "declined": "yellow",
    "cancelled": "yellow",
}
NOTE_EVERY_S = 15.0
"""How often a console that is not a terminal (a log, CI) gets a progress line in a long model step."""


def short(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def duration(ms: float | None) -> str:
    """A latency as people read it: 0.4 ms, 85 ms, 2.3 s, 4 min 05 s."""
    if ms is None:
        return ""
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds:02d} s"


class _StepStatus:
    """The live line of a running model step: elapsed time and tokens so far."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.started = time.monotonic()
        self.chunks = 0
        self.waiting = ""
        """Why the call waits for its endpoint ("" once it is sent)."""

    def line(self) -> str:
        elapsed = duration((time.monotonic() - self.started) * 1000)
        made = f"{self.chunks} tokens so far" if self.chunks else "reading the prompt"
        if self.waiting:
            made = f"waiting: {self.waiting}"
        return f"model   step {self.step + 1} · {elapsed} · {made}"

    def __rich__(self) -> Text:
        return Text(self.line(), style="dim cyan")


class LiveRenderer:
    """Prints each stream item as it arrives; answer text streams inline. While a model step runs,
    a terminal shows a live line with its elapsed time and tokens so far; other consoles get that
    line every NOTE_EVERY_S seconds (``tick`` is called about once a second)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._streaming = False
        self._status: _StepStatus | None = None
        self._live: Live | None = None
        self._noted = 0.0

    def __call__(self, item: StreamItem) -> None:
        if isinstance(item, ModelProgress):
            if self._status is not None:
                self._status.chunks = item.chunks
            return
        if isinstance(item, ModelWaiting):
            self._waiting(item)
            return
        if isinstance(item, ModelDelta):
            self._stop_live()
            if not self._streaming:
                self.console.print("[bold]answer[/]  ", end="")
                self._streaming = True
            self.console.print(item.text, end="", markup=False, highlight=False)
            return
        if self._streaming:
            self.console.print()
            self._streaming = False
        if isinstance(item, (ev.ModelCallFinished, ev.TurnFinished)):
            self._stop_live()
            self._status = None
        line = self._line(item)
        if line:
            self.console.print(line, highlight=False)
        if isinstance(item, ev.ModelCallStarted):
            self._start_step(item.step)

    def tick(self) -> None:
        """Called while nothing arrives: a progress line for consoles without a live display."""
        status = self._status
        if status is None or self._live is not None or self._streaming:
            return
        now = time.monotonic()
        if now - max(self._noted, status.started) >= NOTE_EVERY_S:
            self._noted = now
            self.console.print(status.line(), style="dim", highlight=False)

    def close(self) -> None:
        self._stop_live()

    def _waiting(self, item: ModelWaiting) -> None:
        """The live line says the call waits (and why); other consoles get one line per wait."""
        if self._status is None:
            return
        self._status.waiting = item.reason if item.waiting else ""
        if item.waiting and self._live is None:
            ahead = f" · {item.ahead} calls ahead" if item.ahead else ""
            self.console.print(f"[dim]model   waiting: {item.reason}{ahead}[/]", highlight=False)

    def _start_step(self, step: int) -> None:
        self._status = _StepStatus(step)
        self._noted = 0.0
        if self.console.is_terminal:
            self._live = Live(self._status, console=self.console, transient=True, refresh_per_second=2)
            self._live.start()

    def _stop_live(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _line(self, e: ev.Event) -> str | None:
        if isinstance(e, ev.StateChanged):
            return f"[dim]state[/]   {e.from_state} → [bold]{e.to_state}[/] [dim]({e.cause})[/]"
        if isinstance(e, ev.ModelCallStarted):
            return (
                f"[cyan]model[/]   step {e.step + 1} · {e.model} · {e.message_count} messages, "
                f"{e.tools_offered} tools offered"
            )
        if isinstance(e, ev.ModelCallFinished):
            return model_finished(e)
        if isinstance(e, ev.ModelCorrected):
            return f"[yellow]correct[/] {correction(e)}"
        if isinstance(e, ev.ToolCallRequested):
            return f"[magenta]tool[/]    → {e.tool_name} {short(e.arguments_json, 200)}"
        if isinstance(e, ev.ToolCallFinished):
            style = STATUS_STYLE.get(e.status, "white")
            return (
                f"[magenta]tool[/]    ← {e.tool_name} [{style}]{e.status}[/] in {duration(e.elapsed_ms)} · "
                f"{short(e.content)}"
            )
        if isinstance(e, ev.LoopGuardTriggered):
            return f"[yellow]guard[/]   {e.guard}: {e.reason}; the model answers without tools"
        if isinstance(e, ev.ModelFallback):
            return f"[yellow]fallback[/] {e.from_model} → {e.to_model}{_cause(e)}: {short(e.reason, 200)}"
        if isinstance(e, ev.ModelBreakerChanged):
            return f"[yellow]breaker[/]  {breaker_change(e)}"
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


def _cause(e: ev.ModelFallback) -> str:
    return " (breaker open)" if e.cause == "breaker_open" else ""


def breaker_change(e: ev.ModelBreakerChanged) -> str:
    return f"{e.model} at {e.endpoint}: {e.from_state} → {e.to_state} ({short(e.reason, 200)})"


def model_finished(e: ev.ModelCallFinished) -> str:
    if e.status != "ok":
        return f"[red]model   step {e.step + 1} failed after {duration(e.latency_ms)}: {e.error}[/]"
    cached = f" ({e.cached_input_tokens} cached)" if e.cached_input_tokens else ""
    return (
        f"[cyan]model[/]   step {e.step + 1} done in {duration(e.latency_ms)} · "
        f"{e.input_tokens} in{cached} / {e.output_tokens} out tokens · {e.finish_reason}"
    )


def correction(e: ev.ModelCorrected) -> str:
    """One line: what the model wrote that was corrected, and what it was told."""
    dropped = [
        f"{c['name']}({short(json.dumps(c['arguments']), 60)})" for c in json.loads(e.dropped_calls_json)
    ]
    what = {
        "unreadable_call": "an unreadable tool call",
        "repeated_call": "calls already made: " + ", ".join(dropped) + " (not run again)",
        "call_without_tools": "a tool call when none may be made",
        "no_answer": "no answer text",
    }.get(e.kind, e.kind)
    told = f"; told: {short(e.correction, 120)}" if e.correction else ""
    return f"step {e.step + 1}, answer {e.attempt}: {what}{told}"


def sessions_table(rows: list[dict[str, Any]], width: int = 80) -> Table:
    """Sessions, newest activity first as the store lists them; fits 80 columns (the session id is
    whole, so it can be copied into ``turnlog show``)."""
    table = Table(title="sessions", title_justify="left", pad_edge=False, box=None, header_style="bold")
    table.add_column("session", no_wrap=True, min_width=32)
    table.add_column("state", overflow="fold", min_width=8)
    table.add_column("turns", justify="right", no_wrap=True, min_width=5)
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("user · agent", overflow="ellipsis", no_wrap=True, max_width=max(16, width - 64))
    for r in rows:
        table.add_row(
            r["session_id"],
            r["current_state"] + (" (closed)" if r["closed"] else ""),
            str(r["turns"]),
            f"{r['input_tokens']}/{r['output_tokens']}",
            f"{r['user_id']} · {r['agent_id']}",
        )
    return table


def print_timeline(
    console: Console,
    session: dict[str, Any],
    messages: list[dict[str, Any]],
    states: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    notes: list[str] = (),  # type: ignore[assignment]
) -> None:
    console.print(
        f"[bold]session[/] {session['session_id']} · user {session['user_id']} · agent "
        f"{session['agent_id']} · model {session['model_name']} · state [bold]{session['current_state']}[/]"
        f" · v{session['state_version']} · tokens {session['input_tokens']} in"
        f" / {session['output_tokens']} out"
    )
    path = " → ".join([states[0]["from_state"]] + [s["to_state"] for s in states]) if states else "IDLE"
    console.print(f"[bold]state path[/] {path}", highlight=False)
    if session["current_state"] == "ERROR":
        reason = (
            next((s["detail"] for s in reversed(states) if s["to_state"] == "ERROR"), "") or "not recorded"
        )
        console.print(Text.assemble(("error ", "red bold"), reason), highlight=False)
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
    for col in ("call", "tool", "iteration", "status", "attempts", "elapsed", "arguments"):
        tool_table.add_column(col)
    for t in tools:
        style = STATUS_STYLE.get(t["status"], "white")
        tool_table.add_row(
            t["call_id"],
            t["tool_name"],
            str(t["iteration"]),
            f"[{style}]{t['status']}[/]",
            str(t["attempts"]),
            duration(t["elapsed_time_ms"]),
            short(t["input_json"], 80),
        )
    console.print(tool_table)
    if notes:
        console.print("[bold]corrections, guards and fallbacks[/]")
        for note in notes:
            console.print(f"  {note}", highlight=False)


def event_notes(events: list[ev.Event]) -> list[str]:
    """What the tables do not show: corrections the model got, loop guards, model fallbacks."""
    notes = []
    for e in events:
        if isinstance(e, ev.ModelCorrected):
            notes.append(f"v{e.version} correction · {correction(e)}")
        elif isinstance(e, ev.LoopGuardTriggered):
            notes.append(f"v{e.version} guard · {e.guard}: {e.reason}")
        elif isinstance(e, ev.ModelFallback):
            notes.append(
                f"v{e.version} fallback · step {e.step + 1}: {e.from_model} → {e.to_model}{_cause(e)}: "
                f"{e.reason}"
            )
        elif isinstance(e, ev.ModelBreakerChanged):
            notes.append(f"v{e.version} breaker · step {e.step + 1}: {breaker_change(e)}")
    return notes
