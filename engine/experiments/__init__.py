"""Experiments: replay recorded sessions against a changed agent and report what changes.

One module per concept: ``namespace`` (experiment ids and session ids on the log), ``selection``
(which recorded sessions), ``recording`` (a recorded session read back as turns), ``tool_server``
(tool calls served from the recording), ``runner`` (concurrent, resumable replays), ``compare``
(what differs, per turn and overall) and ``report`` (the result as JSON-ready data).
"""

from .compare import ExperimentReport, SessionDiff, TurnDiff, compare_session, summarize
from .namespace import EXPERIMENT_PREFIX, is_experiment_session
from .recording import RecordedCall, RecordedTurn, Recording, load_recording
from .runner import ExperimentRunner, ExperimentSpec, list_experiments, load_spec
from .selection import Selection, select_sessions
from .tool_server import UNMATCHED_ERROR, RecordedTools

__all__ = [
    "EXPERIMENT_PREFIX",
    "ExperimentReport",
    "ExperimentRunner",
    "ExperimentSpec",
    "RecordedCall",
    "RecordedTools",
    "RecordedTurn",
    "Recording",
    "Selection",
    "SessionDiff",
    "TurnDiff",
    "UNMATCHED_ERROR",
    "compare_session",
    "is_experiment_session",
    "list_experiments",
    "load_recording",
    "load_spec",
    "select_sessions",
    "summarize",
]
