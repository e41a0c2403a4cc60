"""Tools: definitions, argument validation, execution and result shaping."""

from .execute import MARKERS, ToolOutcome, ToolStatus, run_tool_call
from .ledger import NOT_APPLIED
from .registry import DEFAULT_TIMEOUT_S, Tool, ToolRegistry, default_formatter, tool
from .validation import ArgumentProblem, parse_arguments

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MARKERS",
    "NOT_APPLIED",
    "ArgumentProblem",
    "Tool",
    "ToolOutcome",
    "ToolRegistry",
    "ToolStatus",
    "default_formatter",
    "parse_arguments",
    "run_tool_call",
    "tool",
]
