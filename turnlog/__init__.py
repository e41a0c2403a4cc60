"""turnlog's application layer: the embedded deployment and the `turnlog` CLI.

The library lives in ``engine`` (events, state machine, turn loop, tools, models, log),
``projections`` (read models) and ``consumers`` (worker, projector); this package wires them.
"""

from turnlog.engine import *  # noqa: F403  (the public API, re-exported)
from turnlog.engine import __all__ as _engine_all

from .app import EmbeddedApp

__all__ = [*_engine_all, "EmbeddedApp"]
