"""The shape holds: layers point one way, and the public surface is what we say it is."""

from __future__ import annotations

import ast
from pathlib import Path

import turnlog
from turnlog import engine

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("engine", "projections", "consumers", "gateway", "examples")
"""The repository's top-level folders that install as ``turnlog.<name>``; the rest of
``turnlog`` (the CLI and the embedded app) is the application layer, called "app" here."""
FORBIDDEN = {
    "engine": {"projections", "consumers", "app", "gateway", "examples"},
    "projections": {"consumers", "app", "gateway", "examples"},
    "consumers": {"app", "gateway", "examples"},
    "gateway": {"app", "examples"},
}
SOURCE_DIRS = (*LAYERS, "turnlog", "tests", "bench", "scripts")


def layer_of(module: str) -> str | None:
    """The layer an absolute import names: ``turnlog.engine.fold`` -> engine, ``turnlog.cli`` ->
    app; None for third-party modules."""
    parts = module.split(".")
    if parts[0] != "turnlog":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "app"


def absolute_imports(folder: str) -> dict[str, set[str]]:
    """Every module imported absolutely by the .py files under ``folder``, with the files."""
    found: dict[str, set[str]] = {}
    for path in (REPO / folder).rglob("*.py"):
        if "node_modules" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def test_layers_point_one_way() -> None:
    for package, forbidden in FORBIDDEN.items():
        leaks: dict[str, set[str]] = {}
        for module, files in absolute_imports(package).items():
            if layer_of(module) in forbidden:
                leaks.setdefault(module, set()).update(files)
        assert not leaks, f"{package} must not import {leaks}"


def test_nothing_imports_the_old_top_level_names() -> None:
    """Installed, turnlog is one import name: ``engine`` etc. exist only as repository folders."""
    old = {
        module: sorted(files)
        for folder in SOURCE_DIRS
        for module, files in absolute_imports(folder).items()
        if module.split(".")[0] in LAYERS
    }
    assert not old, f"import these as turnlog.<name>: {old}"


def test_public_api_is_exported_and_importable() -> None:
    assert sorted(engine.__all__) == sorted(set(engine.__all__)), "duplicate names in engine.__all__"
    for name in engine.__all__:
        assert hasattr(engine, name), name
    expected = {
        "Agent",
        "AgentDirectory",
        "AgentSessions",
        "SessionInfo",
        "SessionState",
        "SessionStatus",
        "Cause",
        "TRANSITIONS",
        "check_transition",
        "fold",
        "EventLog",
        "MemoryEventLog",
        "SqliteEventLog",
        "KafkaEventLog",
        "LogRecord",
        "SessionSummary",
        "partition_for",
        "NOT_APPLIED",
        "Model",
        "ModelRequest",
        "ModelResponse",
        "TextDelta",
        "Usage",
        "FunctionModel",
        "ScriptedModel",
        "call",
        "reply",
        "ChatMessage",
        "ModelDelta",
        "ModelProgress",
        "ModelWaiting",
        "StreamItem",
        "Endpoints",
        "EndpointLimits",
        "BreakerPolicy",
        "Tool",
        "ToolRegistry",
        "ToolOutcome",
        "ToolStatus",
        "tool",
        "TurnRunner",
        "TurnlogError",
        "ConfigurationError",
        "EventError",
        "EventEncodeError",
        "MalformedEventError",
        "UnknownSchemaError",
        "LogError",
        "ConcurrencyError",
        "LogUnavailableError",
        "PartitionNotOwnedError",
        "OutOfOrderError",
        "SessionError",
        "SessionNotFoundError",
        "SessionClosedError",
        "SessionExpiredError",
        "SessionActiveError",
        "Lifecycle",
        "IllegalTransitionError",
        "InputError",
        "MessageTooLargeError",
        "ModelError",
        "ModelTimeoutError",
        "ContextLengthError",
        "ContextPolicy",
        "MemoryPolicy",
        "ToolFailure",
        "SessionAdmin",
        "SessionClient",
        "TurnResult",
        "TurnWaitTimeoutError",
        "SnapshotFormatError",
        "SnapshotNotFoundError",
        "NoTurnRunningError",
    }
    assert set(engine.__all__) == expected
    assert set(turnlog.__all__) == expected | {"EmbeddedApp"}


def test_every_error_derives_from_the_root() -> None:
    errors = [getattr(engine, n) for n in engine.__all__ if n.endswith(("Error", "Failure"))]
    assert errors and all(issubclass(e, engine.TurnlogError) for e in errors)


LOG_DOMAIN = (
    "admin",
    "admission",
    "agent",
    "budget",
    "client",
    "context",
    "experiments",
    "interrupts",
    "memory",
    "model_call",
    "models",
    "session",
    "snapshots",
    "tools",
    "turn",
    "turn_records",
    "usage",
    "writer",
)
"""Engine modules that decide what a record means for a session (admission rules, approvals,
budgets, cancels, closes, forks, turns): ``engine/log/`` stores, orders, fences and delivers
records and imports none of them, at module level or inside a function. What a submission
becomes reaches a log as an object (``EventLog.admit_with``)."""


def engine_modules_imported(path: Path) -> set[str]:
    """The ``turnlog.engine`` modules (first name under it) a file in ``engine/log/`` imports,
    relatively or absolutely, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 2:  # from .. import x / from ..x import y
            names = [node.module] if node.module else [a.name for a in node.names]
            found.update(name.split(".")[0] for name in names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[:2] == ["turnlog", "engine"] and len(parts) > 2:
                found.add(parts[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["turnlog", "engine"] and len(parts) > 2:
                    found.add(parts[2])
    return found


def test_the_log_imports_no_domain_module() -> None:
    leaks = {}
    for path in sorted((REPO / "engine" / "log").rglob("*.py")):
        name = str(path.relative_to(REPO))
        domain = engine_modules_imported(path) & set(LOG_DOMAIN)
        if domain:
            leaks[name] = sorted(domain)
    assert not leaks, f"engine/log/ must not import the engine's domain modules: {leaks}"


def test_the_log_domain_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The check above would pass on a log module that hides its domain import in a function."""
    sample = tmp_path / "sample.py"
    sample.write_text("from ..events import Event\n\ndef f():\n    from ..interrupts import add_cancel\n")
    assert engine_modules_imported(sample) == {"events", "interrupts"}
