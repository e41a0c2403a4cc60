"""The shape holds: layers point one way, and the public surface is what we say it is."""

from __future__ import annotations

import ast
from pathlib import Path

import turnlog
import turnlog.engine

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "engine": {"projections", "consumers", "turnlog", "gateway", "examples"},
    "projections": {"consumers", "turnlog", "gateway", "examples"},
    "consumers": {"turnlog", "gateway", "examples"},
    "gateway": {"turnlog", "examples"},
}


def imported_packages(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return found


def test_layers_point_one_way() -> None:
    for package, forbidden in FORBIDDEN.items():
        imports = imported_packages(package)
        leaks = {name: sorted(files) for name, files in imports.items() if name in forbidden}
        assert not leaks, f"{package} must not import {leaks}"


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
        "partition_for",
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
        "StreamItem",
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
