"""An agent: the model, tools, prompt and limits a session runs with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Literal, Mapping

import pydantic

from .budget import Budget
from .context import task_state
from .context.memory import MemoryPolicy
from .context.policy import ContextPolicy
from .errors import ConfigurationError
from .models.base import Model
from .models.pricing import PriceTable
from .tools import Tool, ToolRegistry

DEFAULT_MAX_TOOL_ITERATIONS = 8
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Agent:
    """What a session runs with: a model, its tools, the system prompt and the limits of a
    turn. Build one with ``Agent.build``, which takes plain functions as tools and checks them."""

    agent_id: str
    model: Model
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    system_prompt: str = ""
    max_tool_iterations: int = DEFAULT_MAX_TOOL_ITERATIONS
    """Tool batches per turn before the model must answer without tools (seed §4.3)."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest user message accepted, UTF-8 bytes."""
    first_token_timeout_s: float = 15.0
    """Time from request to the model's first chunk (seed §5.3)."""
    model_timeout_s: float = 120.0
    """Total time for one model response (seed §5.3)."""
    on_message: Literal["queue", "interrupt"] = "queue"
    """A user message that arrives while a turn runs: ``queue`` answers it after the turn;
    ``interrupt`` stops the turn at its next step boundary and answers it (seed §8)."""
    prices: PriceTable | None = None
    """What the agent's models cost; without it calls are recorded at cost 0."""
    budget: Budget | None = None
    """Cost limits checked before every model call (needs ``prices``)."""
    context: ContextPolicy = field(default_factory=ContextPolicy)
    """Section budgets, trimming and summaries of what the model is sent (seed §3)."""
    task_state: type[pydantic.BaseModel] | None = None
    """A typed state for the task (every field with a default), changed by the built-in
    ``update_task_state`` tool and shown to the model in every step (second seed §4.2)."""
    memory: MemoryPolicy | None = None
    """Long-term memory: retrieved before each turn, written through the ``remember`` tool."""
    final_tools: frozenset[str] = frozenset()
    """Tools whose success completes a turn's tool work (the last step of its task, like the
    Agents SDK's StopAtTools): the next model call has no tools and writes the answer."""

    def __post_init__(self) -> None:
        if self.max_tool_iterations < 1:
            raise ConfigurationError(f"agent {self.agent_id}: max_tool_iterations must be >= 1")
        if self.on_message not in ("queue", "interrupt"):
            raise ConfigurationError(
                f"agent {self.agent_id}: on_message must be 'queue' or 'interrupt', not {self.on_message!r}"
            )
        if isinstance(self.tools, (list, tuple)):
            object.__setattr__(self, "tools", ToolRegistry(self.tools))
        object.__setattr__(self, "final_tools", frozenset(self.final_tools))
        unknown = sorted(n for n in self.final_tools if self.tools.get(n) is None)
        if unknown:
            raise ConfigurationError(
                f"agent {self.agent_id}: final_tools names tools it does not have: {unknown}"
            )
        if self.task_state is not None:
            task_state.defaults(self.task_state)  # fails now, not mid-turn, if a field lacks one

    @staticmethod
    def build(agent_id: str, model: Model, tools: Iterable[Tool] = (), **options: object) -> Agent:
        return Agent(agent_id, model, ToolRegistry(tools), **options)  # type: ignore[arg-type]


class AgentDirectory:
    """Agents by id; a session names its agent when it is created. Two agents with one id are a
    configuration error (sessions name their agent by id: which one would run them?)."""

    def __init__(self, agents: Iterable[Agent] | Mapping[str, Agent] = ()) -> None:
        items = agents.values() if isinstance(agents, Mapping) else agents
        self._agents: dict[str, Agent] = {}
        for agent in items:
            self.add(agent)

    def add(self, agent: Agent) -> None:
        if not isinstance(agent, Agent):
            raise ConfigurationError(
                f"an AgentDirectory holds Agent objects, not {type(agent).__name__} ({agent!r:.80}); "
                "build them with Agent.build(agent_id, model, tools)"
            )
        if agent.agent_id in self._agents:
            raise ConfigurationError(
                f"two agents have the id {agent.agent_id!r}; give each agent of a directory its own id"
            )
        self._agents[agent.agent_id] = agent

    def get(self, agent_id: str) -> Agent:
        try:
            return self._agents[agent_id]
        except KeyError:
            known = ", ".join(sorted(self._agents)) or "none"
            raise ConfigurationError(f"no agent {agent_id!r} is configured; known agents: {known}") from None

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._agents

    def __iter__(self) -> Iterator[Agent]:
        return iter(list(self._agents.values()))
