"""A turn's next step, derived from the folded session alone (seed §6.3): start a turn for the
oldest waiting message, call the model, run the requested tools, stop, drop what waits after a
close, or nothing. ``next_step`` is pure, so a turn resumed after a crash takes the same step.
``build_request`` (what a model step is sent) is pure too: the gateway rebuilds any past call's."""

from __future__ import annotations

from dataclasses import dataclass

from . import interrupts
from .agent import Agent
from .context import builtins
from .context.assemble import assemble
from .fold import SessionState, ToolCallProgress, TurnProgress
from .messages import ChatMessage
from .models.base import ModelRequest
from .models.endpoints import Endpoints
from .states import SessionStatus
from .tools import guards

S = SessionStatus


@dataclass(frozen=True, slots=True)
class StartTurn:
    message_id: str


@dataclass(frozen=True, slots=True)
class CallModel:
    closing: bool
    """True once the tool loop is over (a loop guard stopped it, or one of the agent's
    ``final_tools`` succeeded): the model is called without tools, to answer."""


@dataclass(frozen=True, slots=True)
class RunTools:
    calls: tuple[ToolCallProgress, ...]


@dataclass(frozen=True, slots=True)
class DropWaiting:
    """The session is closed and messages still wait in its inbox (they arrived after the
    close): each is dropped with the reason, so none is left unanswered and unexplained."""


@dataclass(frozen=True, slots=True)
class Done:
    pass


Stop = interrupts.Stop
Step = StartTurn | CallModel | RunTools | Stop | DropWaiting | Done


def next_step(state: SessionState, agent: Agent) -> Step:
    """What the folded state calls for next; pure."""
    turn = state.turn
    if turn is None:
        if state.inbox:
            return DropWaiting() if state.closed else StartTurn(state.inbox[0].message_id)
        return Done()
    stop = interrupts.stop_for(state, agent)
    if stop is not None:  # also while paused: a cancel or an interrupting message ends the wait
        return stop
    if state.status is S.PAUSED_FOR_USER:  # a tool call waits for the user's approval
        return Done()
    pending = turn.unfinished_calls()
    if pending:
        return RunTools(tuple(pending))
    closing = (
        bool(turn.guard) or turn.iterations >= agent.max_tool_iterations or bool(final_tool_ran(turn, agent))
    )
    return CallModel(closing=closing)


def final_tool_ran(turn: TurnProgress, agent: Agent) -> str:
    """The first of the agent's ``final_tools`` that succeeded in this turn, or ""."""
    if not agent.final_tools:
        return ""
    return next(
        (r.tool_name for r in turn.history if r.status == "success" and r.tool_name in agent.final_tools), ""
    )


def ended_by_final_tool(turn: TurnProgress, agent: Agent) -> bool:
    """The tool loop is over because a final tool succeeded, not because a guard stopped it."""
    return (
        not turn.guard and turn.iterations < agent.max_tool_iterations and bool(final_tool_ran(turn, agent))
    )


def stop_reason(turn: TurnProgress, cap: int) -> tuple[str, str]:
    """The guard that stopped the loop and why (logs written before guard events: the cap)."""
    if turn.guard:
        return turn.guard, turn.guard_reason
    return str(guards.Guard.ITERATION_CAP), f"the turn used its maximum of {cap} tool steps"


def build_request(
    state: SessionState, agent: Agent, closing: bool, endpoints: Endpoints | None = None
) -> ModelRequest:
    """What a model step is sent: the system prompt, the history, and for a closing call (tools
    withdrawn) the note saying why. Pure, so the gateway can show what any past call was sent."""
    messages = assemble(state, agent)
    turn = state.turn
    if closing and turn is not None and ended_by_final_tool(turn, agent):
        messages.append(ChatMessage.system(guards.final_note(final_tool_ran(turn, agent))))
    elif closing and turn is not None:
        guard, reason = stop_reason(turn, agent.max_tool_iterations)
        messages.append(ChatMessage.system(guards.closing_note(guard, reason, agent.max_tool_iterations)))
    tools = () if closing else builtins.session_tools(agent, state).specs()
    turn_id = state.turn.turn_id if state.turn else ""
    return ModelRequest(messages, tools, state.session_id, turn_id, endpoints=endpoints)
