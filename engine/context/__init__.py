"""Context and memory management (seed §3): what each model call is sent, within budgets."""

from .memory import MemoryPolicy
from .policy import ContextPolicy, SectionBudgets

__all__ = ["ContextPolicy", "MemoryPolicy", "SectionBudgets"]
