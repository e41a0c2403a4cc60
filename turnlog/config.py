"""Settings for the CLI and the embedded app, from flags or the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from turnlog.engine.errors import ConfigurationError
from turnlog.engine.models.base import Model


@dataclass(frozen=True)
class ModelSettings:
    base_url: str | None
    api_key: str | None
    model: str | None

    @staticmethod
    def from_env(
        base_url: str | None = None, api_key: str | None = None, model: str | None = None
    ) -> ModelSettings:
        env = os.environ.get
        return ModelSettings(
            base_url=base_url or env("TURNLOG_BASE_URL") or env("OPENAI_BASE_URL"),
            api_key=api_key or env("TURNLOG_API_KEY") or env("OPENAI_API_KEY"),
            model=model or env("TURNLOG_MODEL"),
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
        return OpenAICompatibleModel(self.model, base_url=self.base_url, api_key=self.api_key)


def home_dir(path: str | Path | None = None) -> Path:
    """Where the embedded log, projections and reports live (TURNLOG_HOME, default ./.turnlog)."""
    return Path(path or os.environ.get("TURNLOG_HOME") or ".turnlog")
