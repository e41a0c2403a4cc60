"""turnlog: an event-sourced session engine for LLM agents.

One import name for the whole distribution: the library is ``turnlog.engine`` (events, state
machine, turn loop, tools, models, log; its public API is re-exported here),
``turnlog.projections`` (read models), ``turnlog.consumers`` (worker, projector) and
``turnlog.gateway`` (HTTP); this package's own modules are the application layer that wires
them (the embedded deployment, the CLI).
"""

from typing import TYPE_CHECKING, Any

from turnlog.engine import *  # noqa: F403  (the public API, re-exported)
from turnlog.engine import __all__ as _engine_all

if TYPE_CHECKING:
    from .app import EmbeddedApp

__all__ = [*_engine_all, "EmbeddedApp"]


def __getattr__(name: str) -> Any:
    """``EmbeddedApp`` on first use: a program that only needs the engine does not load the
    projections' database drivers."""
    if name == "EmbeddedApp":
        from .app import EmbeddedApp

        return EmbeddedApp
    raise AttributeError(f"module 'turnlog' has no attribute {name!r}")
