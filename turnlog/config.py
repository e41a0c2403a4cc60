"""Settings for the CLI and the embedded app, from flags or the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnlog.engine.errors import ConfigurationError
from turnlog.engine.models.base import Model
from turnlog.engine.models.connections import ModelConnections

CONNECTIONS_ENV = "TURNLOG_MODEL_CONNECTIONS"
KEEPALIVE_ENV = "TURNLOG_MODEL_KEEPALIVE_S"
MAX_TURNS_ENV = "TURNLOG_MAX_TURNS"
CACHE_ENV = "TURNLOG_CACHE_MB"
KAFKA_INDEX_ENV = "TURNLOG_KAFKA_INDEX_MB"
GC_YOUNG_ENV = "TURNLOG_GC_YOUNG"
MB = 1 << 20


@dataclass(frozen=True)
class ModelSettings:
    base_url: str | None
    api_key: str | None
    model: str | None
    connections: ModelConnections = field(default_factory=ModelConnections)
    """The model client's connection pool (--model-connections, --model-keepalive, or
    TURNLOG_MODEL_CONNECTIONS, TURNLOG_MODEL_KEEPALIVE_S): for the model built here, and for
    agents modules that build their own (``context.settings.connections``)."""

    @staticmethod
    def from_env(
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        *,
        connections: int | None = None,
        keepalive_s: float | None = None,
    ) -> ModelSettings:
        env = os.environ.get
        return ModelSettings(
            base_url=base_url or env("TURNLOG_BASE_URL") or env("OPENAI_BASE_URL"),
            api_key=api_key or env("TURNLOG_API_KEY") or env("OPENAI_API_KEY"),
            model=model or env("TURNLOG_MODEL"),
            connections=connections_from_env(connections, keepalive_s),
        )

    @property
    def configured(self) -> bool:
        return bool(self.base_url)

    def build(self) -> Model:
        """The OpenAI-compatible model these settings name."""
        from turnlog.engine.models.openai_compat import OpenAICompatibleModel

        if not self.model:
            raise ConfigurationError(
                f"a model endpoint is set ({self.base_url}) but no model name; pass --model NAME "
                "or set TURNLOG_MODEL"
            )
        return OpenAICompatibleModel(
            self.model, base_url=self.base_url, api_key=self.api_key, connections=self.connections
        )


def connections_from_env(
    connections: int | None = None, keepalive_s: float | None = None
) -> ModelConnections:
    """The model client's pool: the options given, else the environment, else the defaults."""
    default = ModelConnections()
    size = connections if connections is not None else _env_number(CONNECTIONS_ENV, int)
    keep = keepalive_s if keepalive_s is not None else _env_number(KEEPALIVE_ENV, float)
    try:
        return ModelConnections(
            default.max_connections if size is None else size,
            default.keepalive_s if keep is None else keep,
        )
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{exc} (from --model-connections / {CONNECTIONS_ENV} or --model-keepalive / {KEEPALIVE_ENV})"
        ) from None


def max_turns_from_env(option: int | None, default: int) -> int:
    """The worker's turn limit: the option, else TURNLOG_MAX_TURNS, else ``default``."""
    hint = "the turns one process may run at once"
    turns = _positive_setting(option, "--max-turns", MAX_TURNS_ENV, "the turn limit", hint)
    return default if turns is None else turns


def cache_bytes_from_env(option_mb: int | None, default: int) -> int:
    """What a runner keeps of idle sessions: the option (MB), else TURNLOG_CACHE_MB, else ``default``
    bytes (engine.session_cache)."""
    hint = "the idle sessions a process keeps folded between turns"
    mb = _positive_setting(option_mb, "--cache-mb", CACHE_ENV, "the session cache", hint, unit=" MB")
    return default if mb is None else mb * MB


def kafka_index_bytes_from_env(default: int) -> int:
    """What a Kafka log process holds of the partitions' records (engine.log.kafka_held):
    TURNLOG_KAFKA_INDEX_MB, else ``default`` bytes."""
    hint = "the log's records a Kafka process keeps in memory, idle sessions unloaded past it"
    mb = _positive_setting(None, None, KAFKA_INDEX_ENV, "the Kafka index", hint, unit=" MB")
    return default if mb is None else mb * MB


def gc_young_from_env(default: int) -> int:
    """How many allocations a long-running program lets pass between young collections
    (turnlog.collector): TURNLOG_GC_YOUNG, else ``default``; 0 leaves Python's collector as it is."""
    young = _env_number(GC_YOUNG_ENV, int)
    if young is not None and young < 0:
        raise ConfigurationError(
            f"{GC_YOUNG_ENV}={young} must be 0 (Python's own collector settings) or a number of "
            "allocations between young collections"
        )
    return default if young is None else young


def _positive_setting(
    option: int | None, flag: str | None, env: str, what: str, hint: str, *, unit: str = ""
) -> int | None:
    """A whole-number setting of at least 1: the option, else the environment, else None
    (``flag`` None: a setting with no option, only its variable)."""
    value = option if option is not None else _env_number(env, int)
    if value is not None and value < 1:
        where = env if flag is None else f"{flag} or {env}"
        raise ConfigurationError(
            f"{what} must be at least 1{unit}, not {value} ({where}); size it for {hint}"
        )
    return value


def _env_number(name: str, kind: type[int] | type[float]) -> Any:
    """The environment variable ``name`` as a number, None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ConfigurationError(f"{name}={raw!r} is not {what}; set it to one or unset it") from None


def home_dir(path: str | Path | None = None) -> Path:
    """Where the embedded log, projections and reports live (TURNLOG_HOME, default ./.turnlog)."""
    return Path(path or os.environ.get("TURNLOG_HOME") or ".turnlog")
