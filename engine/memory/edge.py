"""Long-term memory on Qdrant Edge: Qdrant's own engine in-process, the embedded default.

``qdrant-edge-py`` runs Qdrant's storage and search (Rust) inside the process, on one shard in a
folder: segments of vectors and payloads, keyword indexes on ``user_id`` (the tenant key),
``tag`` and ``supersedes``, and a write-ahead log, so a write is on disk when ``remember``
returns and a restart replays what the segments had not flushed yet. A search filtered on one
user reads that user's points through the ``user_id`` index and scores them exactly, so it
costs what the user holds, not what the store holds (bench/README.md, "Long-term memory").
No HNSW graph is built: the shard is never optimised, which would take minutes of CPU at
100,000 memories for no gain at a few thousand memories per user.

Points, payloads, dedup and versions are those of every store (engine.memory.versions), so a
store moves between this engine and a Qdrant server point for point. One process opens a
folder at a time (the WAL is locked); several processes share memories through a Qdrant server
(``QdrantMemoryStore(url=...)``). Every engine call runs on one worker thread per store, which
also makes a write's look-up-then-write atomic within the process.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import qdrant_edge as qe

from ..errors import ConfigurationError, MemoryStoreError
from .base import Memory, MemoryWrite
from .dedup import DUPLICATE_THRESHOLD
from .embedders import Embedder
from .threaded import ThreadedMemoryStore
from .versions import (
    DEDUP_CANDIDATES,
    INDEXED,
    chain,
    from_payload,
    merge_with,
    payload,
    superseding,
)

CONFIG_FILE = "edge_config.json"
"""What Qdrant Edge keeps in a shard folder (its vector size among it)."""
UPSERT_BATCH = 512


class EdgeMemoryStore(ThreadedMemoryStore):
    """A ``MemoryStore`` on a Qdrant Edge shard in the folder ``path`` (created on first use).
    Without ``path`` the store lives in a temporary folder removed by ``close``.

    ``duplicate_threshold``: see engine.memory.dedup."""

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        path: str | None = None,
        duplicate_threshold: float = DUPLICATE_THRESHOLD,
    ) -> None:
        super().__init__(embedder, duplicate_threshold, "edge-memory")
        self._temporary = path is None
        self.path = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="turnlog-memory-"))
        self.where = f"the Qdrant Edge memory store at {self.path}"
        self._shard: qe.EdgeShard | None = None

    async def close(self) -> None:
        """Flush and release the folder (its lock); idempotent. A temporary store is removed."""
        if self._shard is not None:
            await self._call(self._release)
        self._worker.shutdown(wait=True)
        if self._temporary:
            shutil.rmtree(self.path, ignore_errors=True)

    def _remedy(self) -> str:
        return "check that the folder is writable"

    # -- on the worker thread -----------------------------------------------------------------

    def _edge(self) -> qe.EdgeShard:
        if self._shard is None:
            _recover_compaction(self.path)
            self._shard = open_shard(self.path, self.embedder, self.where)
        return self._shard

    def _release(self) -> None:
        shard, self._shard = self._shard, None
        if shard is not None:
            shard.flush()
            shard.close()

    def _query(
        self, user_id: str, vector: np.ndarray, tags: tuple[str, ...], min_score: float, limit: int
    ) -> list[Memory]:
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(np.asarray(vector, dtype=np.float32).tolist()),
            filter=_current(user_id, tags),
            score_threshold=min_score,
            with_payload=True,
        )
        return [from_payload(p.id, p.payload, p.score) for p in self._edge().query(request)]

    def _write(self, fact: Memory, vector: np.ndarray) -> MemoryWrite:
        near = self._query(fact.user_id, vector, (), self.duplicate_threshold, DEDUP_CANDIDATES)
        match = merge_with(fact, near, self.duplicate_threshold)
        if match is None:
            self._edge().update(qe.UpdateOperation.upsert_points([_point(fact, vector)]))
            return MemoryWrite(fact)
        old, replace = match
        if not replace:
            return MemoryWrite(old)
        written = superseding(old, fact)
        assert written.superseded is not None
        # the new version first: a crash between the two leaves both current, and the next
        # write of the fact merges them again, rather than leaving the fact with no current version
        self._edge().update(qe.UpdateOperation.upsert_points([_point(written.memory, vector)]))
        self._edge().update(
            qe.UpdateOperation.set_payload([old.memory_id], {"valid_to_ms": written.superseded.valid_to_ms})
        )
        return written

    def _history(self, user_id: str, memory_id: str) -> list[Memory]:
        return chain(
            self._get(user_id, memory_id),
            lambda older: self._get(user_id, older),
            lambda newer: self._successor(user_id, newer),
        )

    def _get(self, user_id: str, memory_id: str) -> Memory | None:
        try:
            uuid.UUID(memory_id)
        except ValueError:
            return None
        records = self._edge().retrieve([memory_id], True, False)
        found = [from_payload(r.id, r.payload) for r in records]
        return found[0] if found and found[0].user_id == user_id else None

    def _successor(self, user_id: str, memory_id: str) -> Memory | None:
        match = qe.Filter(must=[_field("user_id", user_id), _field("supersedes", memory_id)])
        records, _ = self._edge().scroll(qe.ScrollRequest(limit=1, filter=match, with_payload=True))
        return from_payload(records[0].id, records[0].payload) if records else None

    def _upsert_many(self, facts: list[Memory], vectors: np.ndarray) -> None:
        shard = self._edge()
        points = [_point(fact, vector) for fact, vector in zip(facts, vectors, strict=True)]
        for i in range(0, len(points), UPSERT_BATCH):
            shard.update(qe.UpdateOperation.upsert_points(points[i : i + UPSERT_BATCH]))

    def _forget(self, user_id: str | None, sessions: tuple[str, ...]) -> int:
        match = _forgotten(user_id, sessions)
        found = self._edge().count(qe.CountRequest(exact=True, filter=match))
        if found:
            self._edge().update(qe.UpdateOperation.delete_points_by_filter(match))
            self._edge().flush()
        return found

    def _compact(self) -> None:
        """Rewrite the shard with its live points only: Qdrant marks a deleted point in its
        segment until an optimiser vacuums the segment (at 20 % deleted and 1,000 points), and
        its write-ahead log keeps every update until it is truncated, so both still hold an
        erased memory's text. The new shard is built beside the folder and swapped in
        (``_recover_compaction`` finishes or undoes a swap a crash cut)."""
        points = self._live_points()
        self._release()
        fresh, old = _beside(self.path, "compacting"), _beside(self.path, "old")
        shutil.rmtree(fresh, ignore_errors=True)
        shard = open_shard(fresh, self.embedder, self.where)
        for i in range(0, len(points), UPSERT_BATCH):
            shard.update(qe.UpdateOperation.upsert_points(points[i : i + UPSERT_BATCH]))
        shard.flush()
        shard.close()
        shutil.rmtree(old, ignore_errors=True)
        self.path.rename(old)
        fresh.rename(self.path)
        shutil.rmtree(old)

    def _live_points(self) -> list[qe.Point]:
        points: list[qe.Point] = []
        offset = None
        while True:
            request = qe.ScrollRequest(offset=offset, limit=1000, with_payload=True, with_vector=True)
            records, offset = self._edge().scroll(request)
            points += [
                qe.Point(id=r.id, vector=r.vector, payload=r.payload) for r in records if r.vector is not None
            ]
            if offset is None:
                return points

    def _count(self, user_id: str | None, current_only: bool) -> int:
        must: list[Any] = [_field("user_id", user_id)] if user_id is not None else []
        if current_only:
            must.append(qe.IsNullCondition("valid_to_ms"))
        return self._edge().count(qe.CountRequest(exact=True, filter=qe.Filter(must=must) if must else None))


def open_shard(path: Path, embedder: Embedder, where: str) -> qe.EdgeShard:
    """The shard in ``path``, created with the payload indexes when the folder holds none yet.

    Errors say what to do: another process holds the folder, the folder is not a memory store
    (or is damaged), or it was made with another embedder."""
    if (path / CONFIG_FILE).exists():
        _check_size(path, embedder, where)
        return _opening(lambda: qe.EdgeShard.load(str(path)), where)
    if path.exists() and any(path.iterdir()):
        raise MemoryStoreError(
            f"{where}: the folder is not empty and holds no {CONFIG_FILE}; it is not a Qdrant Edge "
            "store (a Qdrant local-mode store opens with engine.memory.open_store(path, engine='local')); "
            "give an empty or new folder"
        )
    config = qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=embedder.dim, distance=qe.Distance.Cosine))
    shard = _opening(lambda: qe.EdgeShard.create(str(path), config), where)
    for field in INDEXED:
        schema = qe.KeywordIndexParams(is_tenant=True) if field == "user_id" else qe.PayloadSchemaType.Keyword
        shard.update(qe.UpdateOperation.create_field_index(field, schema))
    shard.flush()
    return shard


def _opening(open_: Callable[[], qe.EdgeShard], where: str) -> qe.EdgeShard:
    try:
        return open_()
    except Exception as exc:
        if "WouldBlock" in str(exc):
            raise MemoryStoreError(
                f"{where} is open in another process (or another store object in this one); one "
                "process opens a folder at a time: close the other one, share one store, or run a "
                "Qdrant server and use QdrantMemoryStore(url=...)"
            ) from exc
        raise MemoryStoreError(
            f"{where} cannot be opened: {exc}; the folder looks damaged: move it aside (its "
            "memories are lost unless restored from a backup) and a new store starts there"
        ) from exc


def _check_size(path: Path, embedder: Embedder, where: str) -> None:
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
        size = int(config["vectors"][""]["size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MemoryStoreError(
            f"{where} cannot be opened: {path / CONFIG_FILE} is unreadable ({exc}); the folder looks "
            "damaged: move it aside (its memories are lost unless restored from a backup)"
        ) from exc
    if size != embedder.dim:
        raise ConfigurationError(
            f"{where} holds {size}-dimensional vectors but the embedder {embedder.name!r} makes "
            f"{embedder.dim}; use the embedder it was built with, or another folder"
        )


def _beside(path: Path, what: str) -> Path:
    return path.with_name(f"{path.name}.{what}")


def _recover_compaction(path: Path) -> None:
    """A compaction a crash cut: before the swap the old folder is whole (the new one is
    dropped), after it the new one is (the old one is dropped)."""
    old = _beside(path, "old")
    if old.exists():
        if path.exists():
            shutil.rmtree(old)
        else:
            old.rename(path)
    shutil.rmtree(_beside(path, "compacting"), ignore_errors=True)


def _forgotten(user_id: str | None, sessions: tuple[str, ...]) -> qe.Filter:
    if user_id is not None:
        return qe.Filter(must=[_field("user_id", user_id)])
    return qe.Filter(must=[qe.FieldCondition(key="source", match=qe.MatchAny(list(sessions)))])


def _field(key: str, value: str) -> qe.FieldCondition:
    return qe.FieldCondition(key=key, match=qe.MatchValue(value))


def _current(user_id: str, tags: Sequence[str]) -> qe.Filter:
    """This user's current memories, with one of ``tags`` when given."""
    must: list[Any] = [_field("user_id", user_id), qe.IsNullCondition("valid_to_ms")]
    if tags:
        must.append(qe.FieldCondition(key="tag", match=qe.MatchAny(list(tags))))
    return qe.Filter(must=must)


def _point(fact: Memory, vector: np.ndarray) -> qe.Point:
    values = np.asarray(vector, dtype=np.float32).tolist()
    return qe.Point(id=fact.memory_id, vector=values, payload=payload(fact))
