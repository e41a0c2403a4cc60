"""The logistics example as the agents that `turnlog serve`, `turnlog worker` and `turnlog demo`
run when no other agents are named (``--agents examples.logistics.deploy:directory``): the shape
of an agents module of your own (see README, "Deploy your agents").

The model is the endpoint the program was given (--base-url/--model, TURNLOG_BASE_URL...), the
model the demo chose (the local one), or else the scripted demo model, which can also ask for a
refund that waits for approval. The agent has long-term memory (with the ``memory`` extra):
Qdrant local mode in ``HOME/memory`` (one process per folder), or the Qdrant server named by
TURNLOG_QDRANT_URL (any number of processes); facts are extracted at the end of a task only by
a configured endpoint's model (the scripted model stores ``remember`` notes only; the demo's
small local model is not offered the ``remember`` tool, and is told what it remembers).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import structlog

from turnlog.engine import AgentDirectory, MemoryPolicy, Model

from . import SCRIPTED_TOOLS, TASK_TOOLS, LogisticsBackend, build_agent, demo_model

QDRANT_URL_ENV = "TURNLOG_QDRANT_URL"
log = structlog.get_logger("turnlog.examples")


def directory(context: Any) -> AgentDirectory:
    """The logistics agent for a ``turnlog.agents.AgentContext`` (home, model settings, program)."""
    settings = context.settings
    scripted = context.model is None and not settings.configured
    model: Model = context.model or (settings.build() if settings.configured else demo_model())
    backend = LogisticsBackend(today=dt.date.today(), reports_dir=Path(context.home) / "reports")
    extractor = model if settings.configured else None
    tools = SCRIPTED_TOOLS if scripted else TASK_TOOLS  # the scripted model can refund
    # the demo's local model (a model the demo chose, no endpoint) does best with the task's tools only
    memory = memory_policy(
        Path(context.home), extractor, remember_tool=context.model is None or settings.configured
    )
    return AgentDirectory([build_agent(model, backend, tools, memory)])


def memory_policy(home: Path, extractor: Model | None, *, remember_tool: bool = True) -> MemoryPolicy | None:
    """Long-term memory on Qdrant (a server if TURNLOG_QDRANT_URL is set, else embedded under
    ``home``: Qdrant Edge, or local mode with TURNLOG_MEMORY_ENGINE=local or for a folder local
    mode made); None without the ``memory`` extra."""
    try:
        from turnlog.engine.memory.stores import open_store
    except ImportError as exc:
        log.warning("examples.memory_off", reason=f"{exc.name} is missing: pip install -e '.[memory]'")
        return None
    store = open_store(home / "memory", url=os.environ.get(QDRANT_URL_ENV))
    return MemoryPolicy(store, extractor=extractor, remember_tool=remember_tool)
