"""Which agents a program serves: ``--agents module:attr``, the way uvicorn loads ``module:app``.

``turnlog serve``, ``turnlog worker`` and ``turnlog demo`` (and ``turnlog memory``) run the
agents of an ``AgentDirectory`` named by, in order: the ``--agents`` option, the
``TURNLOG_AGENTS`` environment variable, ``agents = "..."`` in the config file (``turnlog.toml``
in the home folder, or the file ``TURNLOG_CONFIG`` names), else the built-in logistics example
(``turnlog.examples.logistics.deploy:directory``).

The target is ``package.module:attribute`` (the attribute may be dotted): an ``AgentDirectory``,
or a function that returns one. The function is called with no arguments, or with an
``AgentContext`` if it takes one (the home folder, and the model endpoint the program was given
with --base-url/--model, for agents that want it). The current directory is importable, as it is
for uvicorn.

Every mistake stops the program with a ``ConfigurationError`` that says what to fix: no such
module or attribute, a module that fails to import (a tool whose JSON Schema does not compile,
two agents with one id), something that is not a directory, a directory with no agents.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from turnlog.engine.agent import AgentDirectory
from turnlog.engine.errors import ConfigurationError, TurnlogError
from turnlog.engine.models.base import Model

from .config import ModelSettings

AGENTS_ENV = "TURNLOG_AGENTS"
CONFIG_ENV = "TURNLOG_CONFIG"
CONFIG_NAME = "turnlog.toml"
DEFAULT_AGENTS = "turnlog.examples.logistics.deploy:directory"
CONFIG_KEYS = frozenset({"agents"})


@dataclass(frozen=True)
class AgentContext:
    """What a function named by ``--agents`` may take: where the program keeps its data, and
    the model it was given."""

    home: Path
    """The data folder (--home, TURNLOG_HOME): a place for the agents' own files."""
    settings: ModelSettings
    """The model endpoint the program was started with (``settings.configured`` False if none)."""
    program: str
    """serve, worker, demo, memory or lifecycle."""
    model: Model | None = None
    """A model the program chose for the built-in example (the demo's local or scripted model);
    None elsewhere."""
    notice: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))
    """Shows the user one line: what the agents turned off (a missing extra) and how to turn it on."""


@dataclass(frozen=True)
class AgentsTarget:
    """Where the agents come from, and who said so (for messages)."""

    target: str
    source: str


def agents_target(option: str | None, home: Path) -> AgentsTarget:
    """The target named by the option, the environment, the config file or the default, in
    that order."""
    if option:
        return AgentsTarget(option, "--agents")
    if os.environ.get(AGENTS_ENV):
        return AgentsTarget(os.environ[AGENTS_ENV], AGENTS_ENV)
    path = config_path(home)
    configured = read_config(path).get("agents")
    if configured is not None:
        if not isinstance(configured, str) or not configured:
            raise ConfigurationError(f"{path}: 'agents' must be a string such as \"mypkg.agents:directory\"")
        return AgentsTarget(configured, str(path))
    return AgentsTarget(DEFAULT_AGENTS, "the default")


def config_path(home: Path) -> Path:
    return Path(os.environ.get(CONFIG_ENV) or home / CONFIG_NAME)


def read_config(path: Path) -> dict[str, Any]:
    """The config file's settings ({} when it does not exist); unknown keys are refused."""
    if not path.is_file():
        if os.environ.get(CONFIG_ENV):
            raise ConfigurationError(f"{CONFIG_ENV} names {path}, which is not a file")
        return {}
    try:
        config = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        raise ConfigurationError(
            f"{path}: unknown setting {unknown[0]!r}; the settings are {', '.join(sorted(CONFIG_KEYS))}"
        )
    return config


def load_agents(found: AgentsTarget, context: AgentContext) -> AgentDirectory:
    """Import the target and return its directory, or raise ConfigurationError saying what to fix."""
    module_name, attribute = _split(found)
    obj = _attribute(_import(module_name, found), attribute, found)
    if callable(obj) and not isinstance(obj, AgentDirectory):
        obj = _call(obj, context, found)
    if not isinstance(obj, AgentDirectory):
        raise ConfigurationError(
            f"{found.target} (from {found.source}) is a {type(obj).__name__}, not an AgentDirectory or a "
            "function returning one; wrap your agents: AgentDirectory([Agent.build(...), ...])"
        )
    if not list(obj):
        raise ConfigurationError(f"{found.target} (from {found.source}) holds no agents; add at least one")
    return obj


def _split(found: AgentsTarget) -> tuple[str, str]:
    module_name, sep, attribute = found.target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(
            f"{found.source} names {found.target!r}; write it as package.module:attribute, "
            "e.g. mypkg.agents:directory"
        )
    return module_name, attribute


def _import(module_name: str, found: AgentsTarget) -> Any:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like uvicorn: your package in the current directory
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"no module named {exc.name!r} (agents {found.target} from {found.source}); install your "
                "package (pip install -e .) or run from the folder that holds it"
            ) from None
        raise ConfigurationError(
            f"importing {module_name} (agents from {found.source}) failed: {exc}"
        ) from None
    except TurnlogError as exc:  # a tool schema that does not compile, duplicate agent ids, ...
        raise ConfigurationError(f"loading agents from {found.target} failed: {exc}") from None
    except Exception as exc:
        raise ConfigurationError(
            f"importing {module_name} (agents from {found.source}) failed: {type(exc).__name__}: {exc}"
        ) from exc


def _attribute(module: Any, attribute: str, found: AgentsTarget) -> Any:
    obj = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = ", ".join(n for n in sorted(vars(module)) if not n.startswith("_")) or "none"
            raise ConfigurationError(
                f"module {module.__name__} has no attribute {attribute!r} (agents from {found.source}); "
                f"its names are: {names}"
            ) from None
    return obj


def _call(factory: Any, context: AgentContext, found: AgentsTarget) -> Any:
    if inspect.iscoroutinefunction(factory):
        raise ConfigurationError(
            f"{found.target} is an async function; give a plain function that returns an AgentDirectory"
        )
    try:
        takes = len(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        takes = 0
    try:
        return factory(context) if takes else factory()
    except TurnlogError as exc:
        raise ConfigurationError(f"building agents with {found.target} failed: {exc}") from None
    except Exception as exc:
        raise ConfigurationError(
            f"building agents with {found.target} failed: {type(exc).__name__}: {exc}"
        ) from exc


def deployed_agents(option: str | None, context: AgentContext) -> AgentDirectory:
    """The agents a program runs: ``--agents`` or what stands in for it (see the module doc)."""
    return load_agents(agents_target(option, context.home), context)
