"""turnlog's engine: events, the state machine, the session fold, the turn loop, tools,
models and the log. Imports nothing from projections, consumers or the app layer."""

from .admin import SessionAdmin
from .agent import Agent, AgentDirectory
from .client import SessionClient, TurnResult
from .context import ContextPolicy, MemoryPolicy
from .errors import (
    ConcurrencyError,
    ConfigurationError,
    ContextLengthError,
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
    NoTurnRunningError,
    OutOfOrderError,
    PartitionNotOwnedError,
    SessionClosedError,
    SessionError,
    SessionNotFoundError,
    SnapshotFormatError,
    SnapshotNotFoundError,
    ToolFailure,
    TurnlogError,
    TurnWaitTimeoutError,
    UnknownSchemaError,
)
from .fold import SessionState, fold
from .log import (
    EventLog,
    KafkaEventLog,
    LogRecord,
    MemoryEventLog,
    SessionSummary,
    SqliteEventLog,
    partition_for,
)
from .messages import ChatMessage
from .models.base import Model, ModelRequest, ModelResponse, TextDelta, Usage
from .models.breaker import BreakerPolicy
from .models.endpoints import Endpoints
from .models.ratelimit import EndpointLimits
from .models.scripted import FunctionModel, ScriptedModel, call, reply
from .session import AgentSessions, SessionInfo
from .states import TRANSITIONS, Cause, SessionStatus, check_transition
from .stream import ModelDelta, ModelProgress, ModelWaiting, StreamItem
from .tools import NOT_APPLIED, Tool, ToolOutcome, ToolRegistry, ToolStatus, tool
from .turn import TurnRunner

__all__ = [
    "NOT_APPLIED",
    "TRANSITIONS",
    "Agent",
    "AgentDirectory",
    "AgentSessions",
    "BreakerPolicy",
    "Cause",
    "ChatMessage",
    "ConcurrencyError",
    "ConfigurationError",
    "EndpointLimits",
    "Endpoints",
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
    "ModelProgress",
    "ModelWaiting",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelTimeoutError",
    "ContextLengthError",
    "ContextPolicy",
    "MemoryPolicy",
    "NoTurnRunningError",
    "OutOfOrderError",
    "PartitionNotOwnedError",
    "ScriptedModel",
    "SessionAdmin",
    "SessionClient",
    "SessionClosedError",
    "SessionError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionState",
    "SessionSummary",
    "SessionStatus",
    "SnapshotFormatError",
    "SnapshotNotFoundError",
    "MemoryEventLog",
    "SqliteEventLog",
    "StreamItem",
    "TextDelta",
    "Tool",
    "ToolFailure",
    "ToolOutcome",
    "ToolRegistry",
    "ToolStatus",
    "TurnResult",
    "TurnRunner",
    "TurnWaitTimeoutError",
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
