"""An agent: the model, tools, prompt and limits a session runs with."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
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
AfterExpiry = Literal["refuse", "new_session"]


@dataclass(frozen=True)
class Lifecycle:
    """How long a session lives (issue 43): when an idle one is closed, and how long a closed
    one's content is kept. ``None`` is "never", so the default keeps everything forever; a
    deployment sets its default on the ``AgentDirectory`` (``turnlog serve --idle-expiry``,
    ``TURNLOG_IDLE_EXPIRY``), an agent its own (``Agent.lifecycle``). The lifecycle sweeper
    (consumers/lifecycle.py) applies it."""

    idle_expiry: timedelta | None = None
    """A session with no event for this long (resting, or paused for the user, with no message
    waiting) is closed: ``SessionClosed(reason="expired")`` (engine.expiry)."""
    retain_closed_for: timedelta | None = None
    """This long after a session was closed (expired or force-finished), its content is erased
    through the deployment's eraser; its metadata stays."""
    after_expiry: AfterExpiry = "refuse"
    """A message to an expired session: ``refuse`` answers ``SessionExpiredError`` (HTTP 409
    ``session_expired``); ``new_session`` posts it to the session's successor (same agent,
    user and role; ``engine.expiry.successor_id``), created on first use."""

    def __post_init__(self) -> None:
        for name in ("idle_expiry", "retain_closed_for"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
                raise ConfigurationError(
                    f"Lifecycle.{name} is a positive timedelta, or None for never; not {value!r}"
                )
        if self.after_expiry not in ("refuse", "new_session"):
            raise ConfigurationError(
                f"Lifecycle.after_expiry is 'refuse' or 'new_session', not {self.after_expiry!r}"
            )

    @property
    def idle_expiry_ms(self) -> int | None:
        return _ms(self.idle_expiry)

    @property
    def retain_closed_ms(self) -> int | None:
        return _ms(self.retain_closed_for)


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)


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
    lifecycle: Lifecycle | None = None
    """When its sessions expire and how long closed ones keep their content; None: the
    deployment's default (``AgentDirectory.lifecycle``)."""

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
    configuration error (sessions name their agent by id: which one would run them?).
    ``lifecycle`` is the deployment's default for agents that set none."""

    def __init__(
        self, agents: Iterable[Agent] | Mapping[str, Agent] = (), *, lifecycle: Lifecycle | None = None
    ) -> None:
        items = agents.values() if isinstance(agents, Mapping) else agents
        self.lifecycle = lifecycle or Lifecycle()
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

    def lifecycle_of(self, agent_id: str) -> Lifecycle:
        """The agent's own lifecycle, else the deployment's default (also for an agent this
        directory does not know: its sessions still age)."""
        agent = self._agents.get(agent_id)
        own = agent.lifecycle if agent is not None else None
        return own if own is not None else self.lifecycle

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._agents

    def __iter__(self) -> Iterator[Agent]:
        return iter(list(self._agents.values()))
