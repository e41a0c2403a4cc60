"""Which model an agent uses comes from a configuration file, reloaded while workers run (seed §5.1).

A routing file (JSON) names the models and, per agent, its model, its backup, and optionally a
candidate model that gets a share of sessions (gray release)::

    {"models": {"main":  {"base_url": "http://...", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY",
                          "requests_per_minute": 500, "tokens_per_minute": 200000, "max_in_flight": 64,
                          "breaker": {"failures": 5, "cooldown_s": 10}},
                "small": {"base_url": "http://...", "model": "qwen2.5", "native_tools": false,
                          "context_window": 8192}},
     "agents": {"logistics-assistant": {"model": "main", "backup": "small",
                                        "candidate": "small", "candidate_share": 0.1}}}

A model's client-side limits (``max_in_flight``, ``requests_per_minute``, ``tokens_per_minute``,
``max_retry_wait_s``: engine.models.ratelimit) and its breaker's settings (``breaker``:
engine.models.breaker.BreakerPolicy) apply to its endpoint; a reload changes them in the running
process. The breakers and limiters are the ones of the registry given to ``RoutedModel`` (or
the request's): shared with every other model of the process that calls the same endpoint.

``RoutedModel`` is the agent's Model. On each call it checks the file (one ``stat``) and reloads it
when it changed; a file that no longer parses is reported and the last good routing stays in force.
The candidate choice is sticky per session: a hash of the session id, so a session never switches
models mid-conversation because of the gray release. Every call runs through a FallbackModel of the
chosen model and the backup (and the degraded responder, if given), and the model used is recorded
on the model-call events.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

import structlog

from ..errors import ConfigurationError
from .base import Model, ModelChunk, ModelRequest
from .breaker import BreakerPolicy
from .endpoints import Endpoints
from .fallback import FallbackModel
from .ratelimit import DEFAULT_RETRY_WAIT_S, EndpointLimits

log = structlog.get_logger("turnlog.routing")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    """The routing file's name for this model (what events record)."""
    model: str
    """The provider's model name."""
    base_url: str | None = None
    api_key_env: str | None = None
    native_tools: bool = True
    context_window: int | None = None
    first_token_timeout_s: float | None = None
    response_timeout_s: float | None = None
    max_in_flight: int | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: int | None = None
    max_retry_wait_s: float = DEFAULT_RETRY_WAIT_S
    breaker: BreakerPolicy = BreakerPolicy()

    @property
    def limits(self) -> EndpointLimits:
        return EndpointLimits(
            self.max_in_flight, self.requests_per_minute, self.tokens_per_minute, self.max_retry_wait_s
        )


@dataclass(frozen=True, slots=True)
class AgentRoute:
    model: str
    backup: str | None = None
    candidate: str | None = None
    candidate_share: float = 0.0


@dataclass(frozen=True, slots=True)
class Routing:
    models: Mapping[str, ModelSpec]
    agents: Mapping[str, AgentRoute]

    @staticmethod
    def parse(data: Any, source: str) -> Routing:
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            raise ConfigurationError(f'{source}: expected {{"models": {{...}}, "agents": {{...}}}}')
        models = {name: _spec(name, entry, source) for name, entry in data["models"].items()}
        agents = {
            name: _route(name, entry, models, source) for name, entry in (data.get("agents") or {}).items()
        }
        return Routing(models, agents)

    @staticmethod
    def load(path: Path) -> Routing:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigurationError(f"cannot read the routing file {path}: {exc}") from exc
        return Routing.parse(data, str(path))


def _spec(name: str, entry: Any, source: str) -> ModelSpec:
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        raise ConfigurationError(
            f'{source}: model {name!r} needs at least {{"model": "<provider model name>"}}'
        )
    known = set(ModelSpec.__dataclass_fields__) - {"name"}
    unknown = set(entry) - known
    if unknown:
        raise ConfigurationError(
            f"{source}: model {name!r} has unknown settings {sorted(unknown)}; known: {sorted(known)}"
        )
    settings = dict(entry)
    try:
        if "breaker" in settings:
            settings["breaker"] = _breaker(settings["breaker"])
        spec = ModelSpec(name=name, **settings)
        spec.limits  # noqa: B018 - checks the limits now, not on the first call
    except (TypeError, ConfigurationError) as exc:
        raise ConfigurationError(f"{source}: model {name!r}: {exc}") from None
    return spec


def _breaker(entry: Any) -> BreakerPolicy:
    known = set(BreakerPolicy.__dataclass_fields__)
    if not isinstance(entry, dict) or set(entry) - known:
        raise ConfigurationError(f"breaker must be an object with some of {sorted(known)}, not {entry!r}")
    return BreakerPolicy(**entry)


def _route(agent: str, entry: Any, models: Mapping[str, ModelSpec], source: str) -> AgentRoute:
    if not isinstance(entry, dict) or "model" not in entry:
        raise ConfigurationError(f'{source}: agent {agent!r} needs {{"model": "<name from models>"}}')
    route = AgentRoute(
        model=entry["model"],
        backup=entry.get("backup"),
        candidate=entry.get("candidate"),
        candidate_share=float(entry.get("candidate_share", 0.0)),
    )
    for role in ("model", "backup", "candidate"):
        name = getattr(route, role)
        if name is not None and name not in models:
            raise ConfigurationError(
                f"{source}: agent {agent!r} names {role} {name!r}, which is not under models"
            )
    if not 0.0 <= route.candidate_share <= 1.0:
        raise ConfigurationError(f"{source}: agent {agent!r}: candidate_share must be between 0 and 1")
    return route


def in_candidate_share(agent_id: str, session_id: str, share: float) -> bool:
    """Sticky gray release: the same session always lands on the same side."""
    digest = hashlib.sha256(f"{agent_id}:{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def build_model(spec: ModelSpec) -> Model:
    """A Model for one routing entry: the OpenAI-compatible adapter, tools through the prompt when
    the model has no native tool calling."""
    from .openai_compat import OpenAICompatibleModel
    from .prompt_tools import PromptToolsModel

    api_key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
    adapter = OpenAICompatibleModel(
        spec.model, base_url=spec.base_url, api_key=api_key, limits=spec.limits, breaker=spec.breaker
    )
    adapter.name = spec.name
    model: Model = adapter if spec.native_tools else PromptToolsModel(adapter)
    model.context_window = spec.context_window
    model.first_token_timeout_s = spec.first_token_timeout_s
    model.response_timeout_s = spec.response_timeout_s
    return model


class RoutedModel(Model):
    """An agent's model as the routing file says, re-read when the file changes."""

    def __init__(
        self,
        path: Path,
        agent_id: str,
        *,
        degraded: Model | None = None,
        factory: Callable[[ModelSpec], Model] = build_model,
        endpoints: Endpoints | None = None,
    ) -> None:
        self.path = path
        self.endpoints = endpoints or Endpoints()
        """The breakers and limiters used when a request carries no registry of its own."""
        self.agent_id = agent_id
        self.degraded = degraded
        self.factory = factory
        self.name = f"routed:{agent_id}"
        self._stamp = _stamp(path)
        self._routing = Routing.load(path)
        self._models: dict[ModelSpec, Model] = {}
        self._route()  # fail at start-up, not on the first call, if the agent is missing
        # each link of the chain has its own limits; the engine's must cover the whole chain
        self.first_token_timeout_s = self.response_timeout_s = 3600.0

    def refresh(self) -> None:
        """Reload the routing file if it changed; keep the last good routing if it is broken."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            routing = Routing.load(self.path)
            self._route(routing)
        except ConfigurationError as exc:
            log.warning("routing.reload_failed", path=str(self.path), error=str(exc))
            return
        self._routing = routing
        log.info("routing.reloaded", path=str(self.path))

    def model_for(self, request: ModelRequest) -> str:
        self.refresh()
        return self._primary(request)

    async def estimate_input_tokens(self, request: ModelRequest) -> int:
        return await self._model(self._primary(request)).estimate_input_tokens(request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        self.refresh()
        route = self._route()
        primary = self._model(self._primary(request))
        backup = self._model(route.backup) if route.backup and route.backup != primary.name else None
        chain = FallbackModel(primary, backup, self.degraded)
        if request.endpoints is None:
            request = dataclasses.replace(request, endpoints=self.endpoints)
        async for chunk in chain.stream(request):
            yield chunk

    async def aclose(self) -> None:
        for model in self._models.values():
            await model.aclose()

    def _route(self, routing: Routing | None = None) -> AgentRoute:
        routing = routing or self._routing
        route = routing.agents.get(self.agent_id)
        if route is None:
            raise ConfigurationError(f"the routing file {self.path} has no entry for agent {self.agent_id!r}")
        return route

    def _primary(self, request: ModelRequest) -> str:
        route = self._route()
        if route.candidate and in_candidate_share(self.agent_id, request.session_id, route.candidate_share):
            return route.candidate
        return route.model

    def _model(self, name: str) -> Model:
        spec = self._routing.models[name]
        model = self._models.get(spec)
        if (
            model is None
        ):  # a changed entry is a new spec: a new client, the old one stays for in-flight calls
            model = self._models[spec] = self.factory(spec)
        return model


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
