"""The events on the log: one frozen dataclass per event type.

Every event carries the envelope (session, per-session version, ids, time, producer) followed
by its payload. The Avro schemas in ``schemas/`` are the wire contract; ``tests/test_codec``
checks that every class here matches its schema field for field.

JSON-shaped values (tool arguments, tool output) travel as JSON text in ``*_json`` fields so the
schema stays stable however tools evolve. The classes are defined by concern in this package's
modules; ``turnlog.engine.events`` is the import path for all of them.
"""

from __future__ import annotations

from .context import (
    ContextTrimmed,
    HistoryRecalled,
    HistorySummarized,
    MemoriesRetrieved,
    MemoryNoted,
    TaskStateChanged,
)
from .envelope import E, Event, new_id, now_ms, quick_init
from .model import (
    AssistantMessage,
    AuxiliaryModelCall,
    ModelBreakerChanged,
    ModelCallFinished,
    ModelCallStarted,
    ModelCorrected,
    ModelFallback,
)
from .session import (
    RESTORE_POINT,
    BudgetDecided,
    BudgetExceeded,
    CancelRequested,
    SessionClosed,
    SessionCreated,
    SessionErased,
    SessionForked,
    SnapshotTaken,
    StateChanged,
    TurnFinished,
    TurnStarted,
    UserMessageDropped,
    UserMessageReceived,
)
from .tools import (
    ApprovalDecided,
    ApprovalRequested,
    LoopGuardTriggered,
    ToolCallFinished,
    ToolCallRequested,
    ToolCallSpec,
    ToolCallStarted,
    ToolInvoked,
    ToolResultSuperseded,
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        SessionCreated,
        UserMessageReceived,
        UserMessageDropped,
        TurnStarted,
        StateChanged,
        ModelCallStarted,
        ModelCallFinished,
        AuxiliaryModelCall,
        ModelFallback,
        ModelBreakerChanged,
        ModelCorrected,
        AssistantMessage,
        ToolCallRequested,
        ToolCallStarted,
        ToolCallFinished,
        TurnFinished,
        SessionClosed,
        ApprovalRequested,
        ApprovalDecided,
        LoopGuardTriggered,
        ToolResultSuperseded,
        ToolInvoked,
        SnapshotTaken,
        CancelRequested,
        SessionForked,
        ContextTrimmed,
        HistorySummarized,
        HistoryRecalled,
        MemoriesRetrieved,
        MemoryNoted,
        TaskStateChanged,
        BudgetExceeded,
        BudgetDecided,
        SessionErased,
    )
}

for _cls in EVENT_TYPES.values():
    quick_init(_cls)

__all__ = [
    "E",
    "EVENT_TYPES",
    "RESTORE_POINT",
    "ApprovalDecided",
    "ApprovalRequested",
    "AssistantMessage",
    "AuxiliaryModelCall",
    "BudgetDecided",
    "BudgetExceeded",
    "CancelRequested",
    "ContextTrimmed",
    "Event",
    "HistoryRecalled",
    "HistorySummarized",
    "LoopGuardTriggered",
    "MemoriesRetrieved",
    "MemoryNoted",
    "ModelBreakerChanged",
    "ModelCallFinished",
    "ModelCallStarted",
    "ModelCorrected",
    "ModelFallback",
    "SessionClosed",
    "SessionCreated",
    "SessionErased",
    "SessionForked",
    "SnapshotTaken",
    "StateChanged",
    "TaskStateChanged",
    "ToolCallFinished",
    "ToolCallRequested",
    "ToolCallSpec",
    "ToolCallStarted",
    "ToolInvoked",
    "ToolResultSuperseded",
    "TurnFinished",
    "TurnStarted",
    "UserMessageDropped",
    "UserMessageReceived",
    "new_id",
    "now_ms",
]
