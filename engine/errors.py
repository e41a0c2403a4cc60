"""Every error turnlog raises, under one root.

    TurnlogError
    ├── ConfigurationError        the developer's mistake: bad settings, a malformed tool or agent
    ├── EventError                a record on the log cannot be written or read
    │   ├── EventEncodeError
    │   ├── MalformedEventError
    │   ├── UnknownSchemaError
    │   └── SnapshotFormatError   a snapshot's state cannot be read (unknown format, corrupt)
    ├── LogError                  the log refused an operation
    │   ├── ConcurrencyError      another writer appended to the session first
    │   ├── LogUnavailableError   retry later: broker down, transaction outcome unknown
    │   │   └── PartitionNotOwnedError  only a partition's owner appends to it (Kafka)
    │   └── OutOfOrderError       an event arrived before the ones it follows
    ├── SessionError
    │   ├── SessionNotFoundError
    │   ├── SessionClosedError
    │   │   └── SessionExpiredError  closed after no activity for its agent's idle_expiry
    │   ├── SessionActiveError    an expiry found the session busy (a turn, a waiting message)
    │   ├── IllegalTransitionError
    │   ├── ApprovalError         no such tool call waits for the user's decision
    │   ├── NotAwaitingBudgetError no turn waits for a budget decision
    │   ├── SnapshotNotFoundError no snapshot at the version an admin named
    │   ├── NoTurnRunningError    a cancel with no running turn to stop
    │   ├── SessionErasedError    the session's content was erased: it cannot be forked
    │   └── TurnWaitTimeoutError  a producer's wait for a message's turn ran out (engine.client)
    ├── InputError                a caller's input is unusable (too large, empty)
    │   ├── MessageTooLargeError
    │   └── InvalidArgumentsError edited tool arguments fail the tool's schema
    ├── ModelError                a model call failed; the turn records it
    │   ├── ModelTimeoutError
    │   └── ContextLengthError    the provider refused the request as too long
    ├── MemoryStoreError          the long-term memory store or its embedder failed
    ├── KeyStoreError             the content keys cannot be read, made or destroyed
    ├── ExportError               an analytics export cannot write its output directory
    └── ToolFailure               raised *by a tool* to report a business error to the model

Messages say what to do next, not only what went wrong.
"""

from __future__ import annotations

import datetime as dt


class TurnlogError(Exception):
    """Root of every error raised by turnlog."""


class ConfigurationError(TurnlogError):
    """Settings, agents or tools are defined wrongly; fix the code or the configuration."""


class EventError(TurnlogError):
    """An event cannot be encoded or decoded."""


class EventEncodeError(EventError):
    """An event's fields do not fit its Avro schema."""


class MalformedEventError(EventError):
    """Bytes on the log are not a valid turnlog event record."""


class UnknownSchemaError(EventError):
    """A record was written with a schema this reader does not know."""


class SnapshotFormatError(EventError):
    """A snapshot's state is in a format this reader does not know, or is corrupt."""


class LogError(TurnlogError):
    """The event log refused an operation."""


class ConcurrencyError(LogError):
    """The session advanced since the writer last read it (optimistic lock on the version)."""

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"session {session_id}: expected version {expected} but the log is at {actual}; "
            "another writer owns this session. Reload the session and retry."
        )
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class DuplicateSubmissionError(LogError):
    """The session already holds this submission (the same event id, or a user message with the
    same message id): a producer's retry or a redelivery. Nothing was appended; the event that
    holds it is at ``version``."""

    def __init__(self, session_id: str, key: str, version: int) -> None:
        super().__init__(
            f"session {session_id} already holds {key.replace(':', ' ', 1)} (at version {version}); "
            "nothing was appended. A retried submission is answered with the event already on the log."
        )
        self.session_id = session_id
        self.key = key
        self.version = version


class LogUnavailableError(LogError):
    """The log cannot take or serve this request right now (broker unreachable, a transaction
    whose outcome is unknown); nothing was lost, retry after a back-off."""


class PartitionNotOwnedError(LogUnavailableError):
    """This process does not own the session's partition (never did, lost it in a rebalance, or
    was fenced as a zombie); only the partition's owner may append to it."""

    def __init__(self, partition: int, detail: str = "") -> None:
        super().__init__(
            f"this process does not own partition {partition} of the log{f' ({detail})' if detail else ''}; "
            "its owner in the consumer group appends to it. Send producer events with EventLog.submit."
        )
        self.partition = partition


class OutOfOrderError(LogError):
    """A projection saw an event whose predecessor it has not applied."""


class SessionError(TurnlogError):
    """An operation does not fit the session it names."""


class SessionNotFoundError(SessionError):
    """No session has this id on the log."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"no session {session_id!r}; list sessions with `turnlog sessions` or create one first"
        )
        self.session_id = session_id


class SessionClosedError(SessionError):
    """The session was force-finished; it takes no more messages."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id} is closed ({reason}); start a new session to continue")
        self.session_id = session_id


class SessionExpiredError(SessionClosedError):
    """The session was closed by its lifecycle after no activity (``Lifecycle.idle_expiry``)."""

    def __init__(self, session_id: str, expired_ms: int | None = None) -> None:
        when = f" at {_utc(expired_ms)}" if expired_ms else ""
        SessionError.__init__(
            self,
            f"session {session_id} expired{when} after a time without activity and takes no more "
            "messages; start a new session to continue",
        )
        self.session_id = session_id
        self.expired_ms = expired_ms
        """When it was closed (the SessionClosed's time), ms since the epoch; None if unknown."""


class SessionActiveError(SessionError):
    """An expiry found the session busy: a turn running, or a message waiting for one. It is
    not idle, so it does not expire."""

    def __init__(self, session_id: str, status: str) -> None:
        super().__init__(
            f"session {session_id} is {status} with work in progress (a turn or a waiting message); "
            "only an idle session expires"
        )
        self.session_id = session_id


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class IllegalTransitionError(SessionError):
    """The state machine has no edge for this (from, to, cause): a bug, never silently ignored."""


class ApprovalError(SessionError):
    """A decision names a tool call that is not waiting for one."""


class NotAwaitingBudgetError(SessionError):
    """A budget decision for a session with no turn paused on its budget."""


class SnapshotNotFoundError(SessionError):
    """A fork or a read named a snapshot version the session does not have."""

    def __init__(self, session_id: str, version: int, available: list[int]) -> None:
        listed = ", ".join(str(v) for v in available[-10:]) or "none yet"
        super().__init__(
            f"session {session_id} has no snapshot at version {version}; its snapshots are at "
            f"versions {listed} (list them with `turnlog snapshots {session_id}`)"
        )
        self.session_id = session_id
        self.version = version


class NoTurnRunningError(SessionError):
    """A cancel found no turn running and no message waiting: there was nothing to stop."""

    def __init__(self, session_id: str, status: str) -> None:
        super().__init__(
            f"session {session_id} is {status} with no turn running, so there is nothing to cancel; "
            "send a message to start one, or force-finish the session to close it"
        )
        self.session_id = session_id


class SessionErasedError(SessionError):
    """The session's content was erased (its data key destroyed): it folds and replays with
    ``[erased]`` in place of content, but nothing can start from its state."""

    def __init__(self, session_id: str, what: str = "forked") -> None:
        super().__init__(
            f"session {session_id} was erased: its content is gone, so it cannot be {what}; "
            "start a new session instead"
        )
        self.session_id = session_id


class TurnWaitTimeoutError(SessionError):
    """A producer waited for a message's turn longer than it allowed (``SessionClient``)."""


class InputError(TurnlogError):
    """A caller's input cannot be accepted as it is."""


class ExperimentNotFoundError(InputError):
    """No experiment with this id on the log (``turnlog experiment list`` names them)."""

    def __init__(self, experiment_id: str) -> None:
        super().__init__(f"no experiment {experiment_id!r} on this log; `turnlog experiment list` lists them")
        self.experiment_id = experiment_id


class NoSessionsSelectedError(InputError):
    """An experiment's selection names no recorded session (unknown ids, or filters that match none)."""


class MessageTooLargeError(InputError):
    """A user message over the agent's ``max_message_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"message is {size} bytes; the limit is {limit} bytes. Split it into several "
            "messages, or raise the agent's max_message_bytes."
        )
        self.size = size
        self.limit = limit


class InvalidArgumentsError(InputError):
    """Arguments given for a tool call (an approval's edit) do not fit the tool's schema."""

    def __init__(self, tool_name: str, problems: str) -> None:
        super().__init__(
            f"arguments for {tool_name} were not accepted: {problems}. Fix them and decide again."
        )
        self.tool_name = tool_name
        self.problems = problems


class ModelError(TurnlogError):
    """A model call failed (transport, provider error, unusable output)."""

    status: int | None = None
    """The HTTP status the endpoint answered, when it answered one."""


class ModelTimeoutError(ModelError):
    """A model call exceeded one of its time limits."""

    def __init__(self, limit: str, seconds: float, hint: str = "") -> None:
        super().__init__(
            f"model call exceeded its {limit} limit of {seconds:g} s" + (f"; {hint}" if hint else "")
        )
        self.limit = limit
        self.seconds = seconds


class ContextLengthError(ModelError):
    """The provider refused the request as longer than the model's context window. The engine
    compacts the history and calls once more; set the agent's ``ContextPolicy.window`` to the
    model's real window so it does not happen at all."""


class MemoryStoreError(TurnlogError):
    """The long-term memory store (Qdrant) or its embedder refused or failed an operation."""


class KeyStoreError(TurnlogError):
    """The content keys (engine.crypto) cannot be read, made, unwrapped or destroyed: the key
    store is unreachable or damaged, or this process lacks the master key that wrapped a key."""


class ExportError(TurnlogError):
    """An analytics export (``turnlog export``) cannot use its output directory: missing, not
    writable, locked by another export, or holding the export of another log or settings."""


class ToolFailure(TurnlogError):
    """Raised by a tool to report a business error ("order not found") to the model.

    The turn does not fail: the message becomes the tool's result, marked as a failure.
    """
