"""Long-term memory (seed §3.3): the store interface here; Qdrant and the embedders in their
own modules, imported on demand because they need the ``turnlog[memory]`` extra."""

from .base import Memory, MemoryStore, MemoryTag, MemoryWrite

__all__ = ["Memory", "MemoryStore", "MemoryTag", "MemoryWrite"]
