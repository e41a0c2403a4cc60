"""turnlog's optional parts (the extras in pyproject.toml): whether one is installed, and the one
line that tells a user how to turn a missing one on.

Decided in one place, from turnlog's own package metadata: an extra is present when every
distribution it lists is installed, so a partial install (one package of the extra but not
another) counts as missing instead of failing later at an import deep in a command.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import metadata

from .errors import ConfigurationError

DISTRIBUTION = "turnlog"
PURPOSES = {
    "gateway": "the HTTP gateway (turnlog serve), its metrics and traces",
    "memory": "long-term memory (Qdrant and the offline embedder)",
    "local": "the local demo model (llama.cpp and Qwen2.5-Coder-1.5B, about 1.1 GB)",
    "export": "analytics exports as Parquet (turnlog export)",
}
"""The extras a user turns on for a feature, and what each is for (``test``, ``docs`` and ``docker`` are
for developers; see pyproject.toml)."""
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([A-Za-z0-9_.-]+)["']""")


class ExtraMissingError(ConfigurationError):
    """A command needs an extra that is not installed; the message says how to install it."""

    def __init__(self, extra: str, needed_for: str) -> None:
        self.extra = extra
        super().__init__(f"{needed_for} needs {missing_note(extra)}")


@dataclass(frozen=True, slots=True)
class ExtraStatus:
    name: str
    purpose: str
    missing: tuple[str, ...]
    """Distributions of the extra that are not installed (empty: the extra is present)."""

    @property
    def present(self) -> bool:
        return not self.missing


@cache
def requirements_of(extra: str) -> tuple[str, ...]:
    """The distribution names turnlog's metadata lists for ``extra`` (normalised)."""
    names = []
    for requirement in metadata.requires(DISTRIBUTION) or []:
        marker = _EXTRA_MARKER.search(requirement)
        name = _REQUIREMENT.match(requirement)
        if marker and name and marker.group(1) == extra and _normal(name.group(1)) != DISTRIBUTION:
            names.append(_normal(name.group(1)))
    return tuple(names)


@cache
def status(extra: str) -> ExtraStatus:
    wanted = requirements_of(extra)
    if not wanted:
        raise ConfigurationError(f"turnlog has no extra {extra!r}; the extras are {', '.join(PURPOSES)}")
    return ExtraStatus(extra, PURPOSES.get(extra, extra), tuple(d for d in wanted if not _installed(d)))


def present(extra: str) -> bool:
    return status(extra).present


def require(extra: str, needed_for: str) -> None:
    """Raise ExtraMissingError unless ``extra`` is installed."""
    if not present(extra):
        raise ExtraMissingError(extra, needed_for)


def off_note(extra: str, feature: str) -> str:
    """The one line a command prints when it runs without ``feature`` for want of ``extra``."""
    return f"{feature} is off: it needs {missing_note(extra)}"


def missing_note(extra: str) -> str:
    missing = status(extra).missing
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return f"the {extra} extra ({shown} not installed); install it with: {install_command(extra)}"


def install_command(extra: str) -> str:
    """``pip install 'turnlog[x]'``, or ``pip install -e '.[x]'`` in an editable checkout."""
    if editable_checkout() is not None:
        return f"pip install -e '.[{extra}]'"
    return f"pip install 'turnlog[{extra}]'"


@cache
def editable_checkout() -> str | None:
    """The checkout turnlog is installed from in editable mode (PEP 610's direct_url.json), or
    None. Every turnlog metadata on the path is looked at: a checkout's own ``turnlog.egg-info``
    (setuptools leaves one) is found first from its folder and has no direct_url.json."""
    for dist in metadata.distributions(name=DISTRIBUTION):
        raw = dist.read_text("direct_url.json")
        try:
            found = json.loads(raw) if raw else {}
        except ValueError:
            continue
        if found.get("dir_info", {}).get("editable"):
            return str(found.get("url", "")).removeprefix("file://")
    return None


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True
