"""The deployment's session lifecycle: its default from the command line or the environment,
and its sweeper with the deployment's eraser (``projections.erasure.open_eraser``); `turnlog
lifecycle`, the sweeper as a program of its own, is in distributed.py.

The default applies to every agent that sets no ``Lifecycle`` of its own. Options win over the
environment (``TURNLOG_IDLE_EXPIRY``, ``TURNLOG_RETAIN_CLOSED_FOR``, ``TURNLOG_AFTER_EXPIRY``),
which wins over the agents directory's own default; with none of them, sessions live forever,
as before.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta

from turnlog.consumers.lifecycle import LifecycleSweeper, sweeper_for
from turnlog.engine.agent import AfterExpiry, AgentDirectory, Lifecycle
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.session import AgentSessions
from turnlog.projections.erasure import open_eraser
from turnlog.projections.store import ProjectionStore

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
NEVER = ("never", "none", "off")


def parse_duration(text: str, what: str) -> timedelta | None:
    """``90s``, ``30m``, ``12h``, ``30d``, ``2w`` or plain seconds; ``never`` for no limit."""
    if text.strip().lower() in NEVER:
        return None
    found = _DURATION.match(text)
    if found is None or float(found.group(1)) <= 0:
        raise ConfigurationError(
            f"{what} must be a positive duration such as 90s, 30m, 12h, 30d or 2w (or 'never'), not {text!r}"
        )
    return timedelta(seconds=float(found.group(1)) * _UNITS[found.group(2)])


@dataclass(frozen=True)
class LifecycleOptions:
    """The lifecycle options of a program (None: not given on the command line)."""

    idle_expiry: str | None = None
    retain_closed_for: str | None = None
    after_expiry: str | None = None

    def default(self) -> Lifecycle | None:
        """The deployment's default from these options and the environment, or None if neither
        sets anything (the agents directory's own default stays)."""
        env = os.environ.get
        idle = self.idle_expiry or env("TURNLOG_IDLE_EXPIRY") or None  # set but empty: unset
        retain = self.retain_closed_for or env("TURNLOG_RETAIN_CLOSED_FOR") or None
        after = self.after_expiry or env("TURNLOG_AFTER_EXPIRY") or None
        if idle is None and retain is None and after is None:
            return None
        if after not in (None, "refuse", "new_session"):
            raise ConfigurationError(f"--after-expiry is 'refuse' or 'new_session', not {after!r}")
        after_expiry: AfterExpiry = "new_session" if after == "new_session" else "refuse"
        return Lifecycle(
            idle_expiry=parse_duration(idle, "--idle-expiry") if idle else None,
            retain_closed_for=parse_duration(retain, "--retain-closed-for") if retain else None,
            after_expiry=after_expiry,
        )

    def apply(self, agents: AgentDirectory) -> AgentDirectory:
        """``agents`` with the deployment default these options give, if any."""
        chosen = self.default()
        if chosen is not None:
            agents.lifecycle = chosen
        return agents


def deployment_sweeper(
    api: AgentSessions,
    store: ProjectionStore,
    *,
    name: str,
    owned_only: bool = True,
    interval_s: float | None = None,
) -> LifecycleSweeper | None:
    """The sweeper for a program's agents (with the deployment's eraser), or None when they set
    no lifecycle."""
    eraser = open_eraser(api, store)
    return sweeper_for(api, store, eraser=eraser, name=name, owned_only=owned_only, interval_s=interval_s)
