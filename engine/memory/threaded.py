"""The ``MemoryStore`` surface of the stores whose engine is synchronous (Qdrant Edge, qdrant-client).

Both engines block, so a store runs every engine call on one worker thread of its own (which
also makes a write's look-up-then-write atomic within the process) and embeds on the default
executor, never on the event loop. A search first counts the user's current memories (an index
look-up) and embeds the query only if there are any: embedding is most of a search's cost, and
most users of a deployment with memory on have none stored yet. A subclass supplies the engine
calls, run on that thread; this class turns them into the async protocol and the engine's errors
into ``MemoryStoreError``.
"""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ..errors import MemoryStoreError, TurnlogError
from ..events import now_ms
from .base import Memory, MemoryWrite
from .embedders import Embedder, default_embedder
from .versions import check_write

T = TypeVar("T")


class ThreadedMemoryStore(ABC):
    where: str
    """What the store is, for error messages ("the Qdrant Edge memory store at ...")."""
    engine_errors: tuple[type[BaseException], ...] = (Exception,)
    """What the engine raises when it fails; reported as ``MemoryStoreError``."""

    def __init__(self, embedder: Embedder | None, duplicate_threshold: float, thread_name: str) -> None:
        self.embedder = embedder if embedder is not None else default_embedder()
        self.duplicate_threshold = duplicate_threshold
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)

    # -- the MemoryStore protocol -------------------------------------------------------------

    async def search(
        self,
        user_id: str,
        query: str,
        *,
        tags: Sequence[str] = (),
        min_score: float = 0.0,
        limit: int = 5,
    ) -> list[Memory]:
        if not query.strip() or limit < 1:
            return []
        if not await self._call(self._count, user_id, True):
            return []  # a user with no memories: nothing to embed the query for
        vector = await self._embed_one(query)
        return await self._call(self._query, user_id, vector, tuple(tags), min_score, limit)

    async def remember(
        self, user_id: str, text: str, tag: str, *, source: str = "", time_ms: int | None = None
    ) -> MemoryWrite:
        text = text.strip()
        check_write(user_id, text, tag)
        vector = await self._embed_one(text)
        fact = Memory(
            memory_id=str(uuid.uuid4()),
            user_id=user_id,
            text=text,
            tag=tag,
            valid_from_ms=time_ms if time_ms is not None else now_ms(),
            source=source,
        )
        return await self._call(self._write, fact, vector)

    async def history(self, user_id: str, memory_id: str) -> list[Memory]:
        return await self._call(self._history, user_id, memory_id)

    # -- extras -------------------------------------------------------------------------------

    async def remember_many(self, facts: Sequence[Memory], vectors: np.ndarray | None = None) -> None:
        """Bulk-load facts as they are, without the duplicate check (benchmarks, migrations);
        ``vectors``: their embeddings, when already computed."""
        if vectors is None:
            vectors = await asyncio.to_thread(self.embedder.embed, [f.text for f in facts])
        await self._call(self._upsert_many, list(facts), vectors)

    async def forget(self, user_id: str | None = None, *, sessions: Sequence[str] = ()) -> int:
        if user_id is None and not sessions:
            return 0
        return await self._call(self._forget, user_id, tuple(sessions))

    async def compact(self) -> None:
        await self._call(self._compact)

    async def count(self, user_id: str | None = None, *, current_only: bool = True) -> int:
        """How many memories (versions, if not ``current_only``) are stored, for one user or all."""
        return await self._call(self._count, user_id, current_only)

    # -- the worker thread --------------------------------------------------------------------

    async def _embed_one(self, text: str) -> np.ndarray:
        vectors = await asyncio.to_thread(self.embedder.embed, [text])
        return np.asarray(vectors[0])

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._worker, fn, *args)
        except TurnlogError:
            raise
        except self.engine_errors as exc:
            raise MemoryStoreError(f"{self.where} failed: {exc}; {self._remedy()}") from exc

    @abstractmethod
    def _remedy(self) -> str:
        """What to check when an engine call fails."""

    # -- the engine's calls, run on the worker thread -----------------------------------------

    @abstractmethod
    def _query(
        self, user_id: str, vector: np.ndarray, tags: tuple[str, ...], min_score: float, limit: int
    ) -> list[Memory]:
        """The user's current memories nearest ``vector``, best first."""

    @abstractmethod
    def _write(self, fact: Memory, vector: np.ndarray) -> MemoryWrite:
        """Store ``fact``, or merge it with a near-duplicate (engine.memory.versions)."""

    @abstractmethod
    def _history(self, user_id: str, memory_id: str) -> list[Memory]: ...

    @abstractmethod
    def _upsert_many(self, facts: list[Memory], vectors: np.ndarray) -> None: ...

    @abstractmethod
    def _count(self, user_id: str | None, current_only: bool) -> int: ...

    @abstractmethod
    def _forget(self, user_id: str | None, sessions: tuple[str, ...]) -> int:
        """Delete the user's memories, or those whose source is one of ``sessions``; how many."""

    @abstractmethod
    def _compact(self) -> None:
        """Rewrite the storage so deleted points are in no file."""
