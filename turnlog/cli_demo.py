"""`turnlog demo` and `turnlog continue`: one turn in the terminal, streamed as it happens."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from turnlog.engine.agent import AgentDirectory
from turnlog.engine.errors import ConfigurationError

from .agents import DEFAULT_AGENTS, AgentContext, AgentsTarget, agents_target, load_agents
from .app import EmbeddedApp
from .cli_common import (
    AgentsOption,
    ApiKeyOption,
    BaseUrlOption,
    HomeOption,
    ModelOption,
    ScriptedOption,
    console,
    run,
)
from .config import ModelSettings, home_dir
from .demo import (
    DemoModel,
    demo_model,
    failure_advice,
    invocation,
    run_turn,
    scripted_requested,
)

commands = typer.Typer()


@commands.command()
def demo(
    home: HomeOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
    scripted: ScriptedOption = False,
    user: Annotated[str, typer.Option(help="User id the session belongs to.")] = "demo-user",
    agents: AgentsOption = None,
    agent: Annotated[str | None, typer.Option(help="Which of --agents to ask (default: the first).")] = None,
    message: Annotated[str | None, typer.Option(help="What to ask (default: the example task).")] = None,
) -> None:
    """Run the seed's example task as a live session and stream what happens.

    The model is, in order: the OpenAI-compatible endpoint given by --base-url / TURNLOG_BASE_URL;
    else the local model (Qwen2.5-Coder-1.5B on llama.cpp, the `local` extra) unless --scripted;
    else the scripted model. With --agents (or TURNLOG_AGENTS, or HOME/turnlog.toml), your agents
    run instead, with their own models: --agent picks one, --message says what to ask.
    """
    settings = ModelSettings.from_env(base_url, api_key, model)
    run(_demo(home, settings, user, scripted_requested(scripted), DemoAsk(agents, agent, message)))


@dataclass(frozen=True)
class DemoAsk:
    """Whose agents the demo runs (--agents), which one (--agent) and what it asks (--message)."""

    agents: str | None
    agent: str | None
    message: str | None


async def _demo(home: Path | None, settings: ModelSettings, user: str, scripted: bool, ask: DemoAsk) -> int:
    root, hint = home_dir(home), invocation(home)
    target = agents_target(ask.agents, root)
    with contextlib.ExitStack() as stack:
        chosen, context = _demo_context(root, settings, scripted, target, stack)
        sid, outcome = await _run_demo(context, user, target, ask)
    console.print(
        f"\nNext:\n  [bold]{hint.command('show', sid)}[/]\n  {hint.command('snapshots', sid)}\n  "
        f"{hint.command('sessions')}",
        highlight=False,
        soft_wrap=True,
    )
    advice = failure_advice(outcome, chosen)
    if advice:
        console.print(f"[red]{advice}[/]", highlight=False)
        return 1
    return 0


def _demo_context(
    root: Path, settings: ModelSettings, scripted: bool, target: AgentsTarget, stack: contextlib.ExitStack
) -> tuple[DemoModel | None, AgentContext]:
    """The example agents get the demo's model (endpoint, local or scripted); your agents bring theirs."""
    chosen = demo_model(console, root, settings, scripted, stack) if target.target == DEFAULT_AGENTS else None
    return chosen, AgentContext(root, settings, "demo", chosen.model if chosen else None)


def _demo_agent(directory: AgentDirectory, wanted: str | None) -> str:
    ids = [a.agent_id for a in directory]
    if wanted is None:
        return ids[0]
    if wanted not in ids:
        raise ConfigurationError(f"no agent {wanted!r} among --agents; the agents are {', '.join(ids)}")
    return wanted


async def _run_demo(context: AgentContext, user: str, target: AgentsTarget, ask: DemoAsk) -> tuple[str, str]:
    """Run one turn of the chosen agent; return the session id and how the turn ended."""
    from turnlog.examples.logistics import TASK

    from .runtime import memory_consumers

    directory = load_agents(target, context)
    chosen = _demo_agent(directory, ask.agent)
    text = ask.message or TASK
    app_ = EmbeddedApp(context.home, list(directory))
    projector = asyncio.create_task(app_.projector.run())
    try:
        session = await app_.api.create_session(chosen, user)
        console.print(f"[dim]session[/] {session.session_id} · log {app_.log.path}", highlight=False)
        console.print(f"[bold]user[/]    {text}", highlight=False)
        outcome = await run_turn(console, app_.api.send_user_message(session.session_id, text))
        for memory in memory_consumers(app_.log, app_.agents, owned_only=False):
            await memory.catch_up()  # what the turn asked to remember is stored before we go
    finally:
        await _close(app_, projector)
    return session.session_id, outcome


async def _close(app_: EmbeddedApp, projector: asyncio.Task[None]) -> None:
    app_.projector.stop()
    await projector
    await app_.projector.catch_up()
    await app_.close()


@commands.command(name="continue")
def continue_cmd(
    session_id: str,
    message: Annotated[
        str | None, typer.Argument(help="A new user message (none: finish a waiting turn).")
    ] = None,
    home: HomeOption = None,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
    model: ModelOption = None,
    scripted: ScriptedOption = False,
    agents: AgentsOption = None,
) -> None:
    """Continue a session (a fork, say): finish the turn it inherited, or answer a new message.

    The model is chosen as for `turnlog demo`; --agents names the agents as there.
    """
    settings = ModelSettings.from_env(base_url, api_key, model)
    run(_continue(home, session_id, message, settings, scripted_requested(scripted), agents))


async def _continue(
    home: Path | None,
    session_id: str,
    message: str | None,
    settings: ModelSettings,
    scripted: bool,
    agents: str | None,
) -> int:
    root, hint = home_dir(home), invocation(home)
    target = agents_target(agents, root)
    with contextlib.ExitStack() as stack:
        chosen, context = _demo_context(root, settings, scripted, target, stack)
        directory = load_agents(target, context)
        app_ = EmbeddedApp(root, list(directory))
        projector = asyncio.create_task(app_.projector.run())
        try:
            state = await app_.api.get_state(session_id)
            if state.agent_id not in directory:
                console.print(
                    f"[red]session {session_id} runs agent {state.agent_id!r}[/], which --agents does not "
                    f"name (it has {', '.join(a.agent_id for a in directory)})",
                    highlight=False,
                )
                return 1
            if message is None and state.turn is None and not state.inbox:
                console.print(
                    f"session {session_id} has no turn waiting; give it a message: "
                    f"[bold]{hint.command('continue', session_id, repr('your message'))}[/]",
                    highlight=False,
                )
                return 1
            if message is not None:
                console.print(f"[bold]user[/]    {message}", highlight=False)
            items = (
                app_.api.send_user_message(session_id, message)
                if message is not None
                else app_.api.run_pending(session_id)
            )
            outcome = await run_turn(console, items)
        finally:
            await _close(app_, projector)
    console.print(f"\nNext:\n  [bold]{hint.command('show', session_id)}[/]", highlight=False, soft_wrap=True)
    advice = failure_advice(outcome, chosen)
    if advice:
        console.print(f"[red]{advice}[/]", highlight=False)
        return 1
    return 0
