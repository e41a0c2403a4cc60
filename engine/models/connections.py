"""How a model client holds its HTTP connections to its endpoint: a deployment setting.

A streamed answer holds one HTTP/1.1 connection for as long as it streams, so a worker holds
one connection per model call in flight: a worker whose turns wait a minute each on a slow model
holds as many connections as it has turns waiting. The pool is therefore sized by default for
the turns a worker runs at once (``consumers.turn_worker.MAX_CONCURRENT_TURNS``), not for a
browser's handful. A call that finds every connection busy waits for one in the endpoint's
limiter (engine.models.ratelimit), where its stream shows it waiting (``ModelWaiting``) with the
reason, instead of blocking unseen inside the HTTP client.

Set it per model (``OpenAICompatibleModel(connections=...)`` in an agents module), or for the
models a program builds from its settings (``turnlog serve|worker --model-connections``,
``--model-keepalive``; ``TURNLOG_MODEL_CONNECTIONS``, ``TURNLOG_MODEL_KEEPALIVE_S``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigurationError

DEFAULT_MAX_CONNECTIONS = 10_000
"""One connection per turn a worker runs at once, at its default turn limit."""
DEFAULT_KEEPALIVE_S = 5.0
"""How long an idle connection is kept for the next call: under the 5 s most servers keep an
idle connection (llama.cpp, uvicorn, Node), so the client rarely reuses one the server closed
(and a request the server closed before answering is sent again, once)."""


@dataclass(frozen=True, slots=True)
class ModelConnections:
    """A model client's connection pool: at most ``max_connections`` open at once (so at most as
    many calls streaming), idle ones kept ``keepalive_s`` seconds."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    keepalive_s: float = DEFAULT_KEEPALIVE_S

    def __post_init__(self) -> None:
        if isinstance(self.max_connections, bool) or not isinstance(self.max_connections, int):
            raise ConfigurationError(f"max_connections must be a whole number, not {self.max_connections!r}")
        if self.max_connections < 1:
            raise ConfigurationError(
                f"max_connections must be at least 1, not {self.max_connections}; size it for the "
                "model calls a process has in flight at once (one per running turn)"
            )
        if not self.keepalive_s >= 0:
            raise ConfigurationError(f"keepalive_s must be >= 0 seconds, not {self.keepalive_s}")
