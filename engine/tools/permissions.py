"""Which tools exist for a session (seed §4.1): the session's role filters the agent's tools.

A tool outside the role is not merely forbidden, it does not exist for that session: it is not
in the model's tool list, and a call naming it (from model output, direct invocation or a log
being replayed) gets the same "no such tool" answer as a name nobody registered, and never runs.
Every route goes through ``tools_for_role``, so there is one place that decides.
"""

from __future__ import annotations

import weakref

from .registry import ToolRegistry

_views: weakref.WeakKeyDictionary[ToolRegistry, dict[str, ToolRegistry]] = weakref.WeakKeyDictionary()


def tools_for_role(registry: ToolRegistry, role: str) -> ToolRegistry:
    """The registry as a session with ``role`` sees it (cached per registry and role)."""
    by_role = _views.setdefault(registry, {})
    view = by_role.get(role)
    if view is None or len(view) > len(registry):
        view = by_role[role] = ToolRegistry(t for t in registry if t.allows(role))
    return view
