"""Long-term memory on Qdrant (seed §3.3): local mode embedded, a Qdrant server when distributed.

One point per version of a fact. A server keeps every user in one collection (a tenant index on
``user_id``); local mode spreads users over ``LOCAL_SHARDS`` collections by a hash of the user
id, because it scans a whole collection and filters in Python on every search. The payload is
``user_id, text, tag, valid_from_ms, valid_to_ms (null while current), supersedes, source``,
with keyword indexes on ``user_id``, ``tag`` and ``supersedes`` (a server uses them; local mode
scans). Every search filters on the user and on ``valid_to_ms`` being null, so a user's
memories never reach another user and superseded versions only come back through ``history``.

A write first looks for the same fact among the user's current memories (engine.memory.versions:
the same text again or an older restatement changes nothing; a newer one supersedes the old
version, which stays readable for audit).

The embedded default is engine.memory.edge (Qdrant's own engine in-process, indexed); local mode
stays selectable (``turnlog.engine.memory.open_store(..., engine="local")``) for stores made with it.

qdrant-client's local mode is synchronous (its AsyncQdrantClient runs local mode on the event
loop too), so every Qdrant call runs on one worker thread per store, and embedding on the
default executor. The single worker also makes a write's look-up-then-write atomic within the
process. Across processes sharing a Qdrant server, two writers of the same user's near-duplicate
facts can both write; the next write of that fact merges them again.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
import warnings
import zlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

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

COLLECTION = "turnlog_memories"
LOCAL_SHARDS = 64
"""Collections a local-mode store spreads users over. Local mode scans every point of a
collection and checks the user filter in Python, point by point, so a user's search costs
what the user's shard holds, not what the store holds. A server uses one collection and
its payload index on ``user_id``."""


class QdrantMemoryStore(ThreadedMemoryStore):
    """A ``MemoryStore`` on Qdrant. Give at most one of ``path`` (local mode on disk),
    ``location`` (``":memory:"``, the default) or ``url`` (a Qdrant server).

    ``shards``: collections the users are spread over (default ``LOCAL_SHARDS`` in local mode,
    1 on a server); keep it unchanged for a given path or server, or users' memories move out
    of sight. ``duplicate_threshold``: see engine.memory.dedup."""

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        path: str | None = None,
        location: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        collection: str = COLLECTION,
        shards: int | None = None,
        duplicate_threshold: float = DUPLICATE_THRESHOLD,
    ) -> None:
        if sum(x is not None for x in (path, location, url)) > 1:
            raise ConfigurationError(
                "QdrantMemoryStore takes one of path= (local mode on disk), location=':memory:' "
                "or url= (a Qdrant server), not several"
            )
        super().__init__(embedder, duplicate_threshold, "qdrant-memory")
        self.collection = collection
        self.shards = shards if shards is not None else (1 if url else LOCAL_SHARDS)
        if self.shards < 1:
            raise ConfigurationError(f"shards must be at least 1, not {self.shards}")
        if location not in (None, ":memory:"):
            raise ConfigurationError(
                f"location={location!r}: pass ':memory:' for an in-memory store, path= for local mode "
                "on disk, or url= for a Qdrant server"
            )
        self.where = f"Qdrant server {url}" if url else f"Qdrant local mode at {path or ':memory:'}"
        self._options: dict[str, Any] = (
            # check_compatibility=False: the client's version probe runs on a thread of its own and
            # raises there when the server is down; our first call reports that instead
            {"url": url, "api_key": api_key, "check_compatibility": False}
            if url
            else {"path": path}
            if path
            else {"location": ":memory:"}
        )
        self._client: QdrantClient | None = None
        self._ready: set[str] = set()

    @property
    def local(self) -> bool:
        return "url" not in self._options

    engine_errors = (UnexpectedResponse, ResponseHandlingException, OSError)

    def _remedy(self) -> str:
        if self.local:
            return "check the path is writable"
        return "check that the server is running and reachable"

    async def close(self) -> None:
        """Release the local storage lock or the server connection; idempotent."""
        if self._client is not None:
            await self._call(self._client.close)
            self._client = None
        self._worker.shutdown(wait=True)

    # -- on the worker thread -----------------------------------------------------------------

    def _qdrant(self) -> QdrantClient:
        if self._client is None:
            client = _open_client(self._options)
            if client is None:
                raise MemoryStoreError(
                    f"{self.where} is open in another client; local mode allows one per path, so "
                    "close the other one, share one QdrantMemoryStore, or run a Qdrant server and pass url="
                )
            self._client = client
        return self._client

    def _name(self, user_id: str) -> str:
        """The collection holding ``user_id``'s memories (stable: crc32 of the user id)."""
        if self.shards == 1:
            return self.collection
        return f"{self.collection}_{zlib.crc32(user_id.encode()) % self.shards:03d}"

    def _mine(self, name: str) -> bool:
        if self.shards == 1:
            return name == self.collection
        suffix = name.removeprefix(f"{self.collection}_")
        return suffix != name and suffix.isdigit() and len(suffix) == 3

    def _shard(self, user_id: str) -> str:
        """``_name(user_id)``, created (or checked against the embedder) on first use."""
        name = self._name(user_id)
        if name not in self._ready:
            self._ensure_collection(self._qdrant(), name)
            self._ready.add(name)
        return name

    def _ensure_collection(self, client: QdrantClient, name: str) -> None:
        dim = self.embedder.dim
        if client.collection_exists(name):
            vectors = client.get_collection(name).config.params.vectors
            size = vectors.size if isinstance(vectors, qm.VectorParams) else None
            if size != dim:
                raise ConfigurationError(
                    f"{self.where}: collection {name!r} holds {size}-dimensional vectors but the "
                    f"embedder {self.embedder.name!r} makes {dim}; use the embedder it was built "
                    "with, or another collection name"
                )
            return
        client.create_collection(name, vectors_config=qm.VectorParams(size=dim, distance=qm.Distance.COSINE))
        with warnings.catch_warnings():
            # local mode warns that it scans instead of using indexes; a server uses them
            warnings.filterwarnings("ignore", message="Payload indexes have no effect", category=UserWarning)
            for field in INDEXED:
                schema = qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=field == "user_id")
                client.create_payload_index(name, field, schema)

    def _query(
        self, user_id: str, vector: np.ndarray, tags: tuple[str, ...], min_score: float, limit: int
    ) -> list[Memory]:
        response = self._qdrant().query_points(
            self._shard(user_id),
            query=vector.tolist(),
            query_filter=_current(user_id, tags),
            limit=limit,
            score_threshold=min_score,
            with_payload=True,
        )
        return [from_payload(p.id, p.payload, p.score) for p in response.points]

    def _write(self, fact: Memory, vector: np.ndarray) -> MemoryWrite:
        near = self._query(fact.user_id, vector, (), self.duplicate_threshold, DEDUP_CANDIDATES)
        match = merge_with(fact, near, self.duplicate_threshold)
        if match is None:
            self._qdrant().upsert(self._shard(fact.user_id), [_point(fact, vector)])
            return MemoryWrite(fact)
        old, replace = match
        return self._supersede(old, fact, vector) if replace else MemoryWrite(old)

    def _supersede(self, old: Memory, fact: Memory, vector: np.ndarray) -> MemoryWrite:
        written = superseding(old, fact)
        assert written.superseded is not None
        self._qdrant().batch_update_points(
            self._shard(fact.user_id),
            [
                qm.UpsertOperation(upsert=qm.PointsList(points=[_point(written.memory, vector)])),
                qm.SetPayloadOperation(
                    set_payload=qm.SetPayload(
                        payload={"valid_to_ms": written.superseded.valid_to_ms}, points=[old.memory_id]
                    )
                ),
            ],
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
        records = self._qdrant().retrieve(self._shard(user_id), [memory_id], with_payload=True)
        found = [from_payload(r.id, r.payload) for r in records]
        return found[0] if found and found[0].user_id == user_id else None

    def _successor(self, user_id: str, memory_id: str) -> Memory | None:
        match = qm.Filter(must=[_field("user_id", user_id), _field("supersedes", memory_id)])
        records, _ = self._qdrant().scroll(
            self._shard(user_id), scroll_filter=match, limit=1, with_payload=True
        )
        return from_payload(records[0].id, records[0].payload) if records else None

    def _upsert_many(self, facts: list[Memory], vectors: np.ndarray, batch: int = 512) -> None:
        by_shard: dict[str, list[qm.PointStruct]] = {}
        for fact, vector in zip(facts, vectors, strict=True):
            by_shard.setdefault(self._shard(fact.user_id), []).append(_point(fact, vector))
        for name, points in by_shard.items():
            for i in range(0, len(points), batch):
                self._qdrant().upsert(name, points[i : i + batch])

    def _forget(self, user_id: str | None, sessions: tuple[str, ...]) -> int:
        client, match = self._qdrant(), _forgotten(user_id, sessions)
        if user_id is not None:
            names = [self._shard(user_id)]
        else:
            names = [c.name for c in client.get_collections().collections if self._mine(c.name)]
        found = 0
        for name in names:
            hits = client.count(name, count_filter=match, exact=True).count
            if hits:
                client.delete(name, points_selector=qm.FilterSelector(filter=match), wait=True)
                found += hits
        return found

    def _compact(self) -> None:
        """Local mode keeps points in a SQLite file per collection: close the client and vacuum
        them, so deleted points are in no page (it reopens on the next call). A server removes
        deleted points from its segments when its optimiser vacuums them (its own settings)."""
        if not self.local or "path" not in self._options:
            return
        if self._client is not None:
            self._client.close()
            self._client, self._ready = None, set()
        for db in sorted(Path(self._options["path"]).glob("collection/*/storage.sqlite")):
            with contextlib.closing(sqlite3.connect(db)) as conn:
                conn.execute("VACUUM")

    def _count(self, user_id: str | None, current_only: bool) -> int:
        must: list[qm.Condition] = [_field("user_id", user_id)] if user_id is not None else []
        if current_only:
            must.append(qm.IsNullCondition(is_null=qm.PayloadField(key="valid_to_ms")))
        client = self._qdrant()
        if user_id is not None:
            names = [self._shard(user_id)]
        else:
            names = [c.name for c in client.get_collections().collections if self._mine(c.name)]
        return sum(client.count(n, count_filter=qm.Filter(must=must), exact=True).count for n in names)


def _forgotten(user_id: str | None, sessions: tuple[str, ...]) -> qm.Filter:
    if user_id is not None:
        return qm.Filter(must=[_field("user_id", user_id)])
    return qm.Filter(must=[qm.FieldCondition(key="source", match=qm.MatchAny(any=list(sessions)))])


def _open_client(options: dict[str, Any]) -> QdrantClient | None:
    """A client, or None when another client holds the local path's lock.

    The lock is tried here first because qdrant-client, failing to take it, leaves the lock
    file open (a ResourceWarning later, somewhere unrelated).
    """
    path = options.get("path")
    if path and _locked_elsewhere(Path(path) / ".lock"):
        return None
    return QdrantClient(**options)


def _locked_elsewhere(lock_file: Path) -> bool:
    if not lock_file.exists():
        return False
    import portalocker  # qdrant-client's own lock library, a dependency of local mode

    with lock_file.open("r+") as handle:
        try:
            portalocker.lock(handle, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
        except portalocker.exceptions.LockException:
            return True
        portalocker.unlock(handle)
    return False


def _field(key: str, value: str) -> qm.FieldCondition:
    return qm.FieldCondition(key=key, match=qm.MatchValue(value=value))


def _current(user_id: str, tags: Sequence[str]) -> qm.Filter:
    """This user's current memories, with one of ``tags`` when given."""
    must: list[qm.Condition] = [
        _field("user_id", user_id),
        qm.IsNullCondition(is_null=qm.PayloadField(key="valid_to_ms")),
    ]
    if tags:
        must.append(qm.FieldCondition(key="tag", match=qm.MatchAny(any=list(tags))))
    return qm.Filter(must=must)


def _point(fact: Memory, vector: np.ndarray) -> qm.PointStruct:
    return qm.PointStruct(id=fact.memory_id, vector=np.asarray(vector).tolist(), payload=payload(fact))
