"""turnlog's engine: events, the state machine, the session fold, the turn loop, tools,
models and the log. Imports nothing from projections, consumers or the app layer."""

from .agent import Agent, AgentDirectory
from .errors import (
    ConcurrencyError,
    ConfigurationError,
    EventEncodeError,
    EventError,
    IllegalTransitionError,
    InputError,
    LogError,
    LogUnavailableError,
    MalformedEventError,
    MessageTooLargeError,
    ModelError,
    ModelTimeoutError,
    OutOfOrderError,
    PartitionNotOwnedError,
    SessionClosedError,
    SessionError,
    SessionNotFoundError,
    ToolFailure,
    TurnlogError,
    UnknownSchemaError,
)
from .fold import SessionState, fold
from .log import EventLog, KafkaEventLog, LogRecord, SqliteEventLog, partition_for
from .messages import ChatMessage
from .models.base import Model, ModelRequest, ModelResponse, TextDelta, Usage
from .models.scripted import FunctionModel, ScriptedModel, call, reply
from .session import AgentSessions, SessionInfo
from .states import TRANSITIONS, Cause, SessionStatus, check_transition
from .stream import ModelDelta, StreamItem
from .tools import Tool, ToolOutcome, ToolRegistry, ToolStatus, tool
from .turn import TurnRunner

__all__ = [
    "TRANSITIONS",
    "Agent",
    "AgentDirectory",
    "AgentSessions",
    "Cause",
    "ChatMessage",
    "ConcurrencyError",
    "ConfigurationError",
    "EventEncodeError",
    "EventError",
    "EventLog",
    "FunctionModel",
    "IllegalTransitionError",
    "InputError",
    "KafkaEventLog",
    "LogError",
    "LogRecord",
    "LogUnavailableError",
    "MalformedEventError",
    "MessageTooLargeError",
    "Model",
    "ModelDelta",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelTimeoutError",
    "OutOfOrderError",
    "PartitionNotOwnedError",
    "ScriptedModel",
    "SessionClosedError",
    "SessionError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionState",
    "SessionStatus",
    "SqliteEventLog",
    "StreamItem",
    "TextDelta",
    "Tool",
    "ToolFailure",
    "ToolOutcome",
    "ToolRegistry",
    "ToolStatus",
    "TurnRunner",
    "TurnlogError",
    "UnknownSchemaError",
    "Usage",
    "call",
    "check_transition",
    "fold",
    "partition_for",
    "reply",
    "tool",
]
