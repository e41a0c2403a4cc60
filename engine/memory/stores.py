"""Which memory store a deployment gets: a Qdrant server by URL when distributed; else
the embedded default, Qdrant Edge in a folder; Qdrant local mode when asked for, or when the
folder already holds a local-mode store (made before Edge was the default), so its memories
stay in reach."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..errors import ConfigurationError
from .embedders import Embedder

if TYPE_CHECKING:
    from .edge import EdgeMemoryStore
    from .qdrant import QdrantMemoryStore

ENGINE_ENV = "TURNLOG_MEMORY_ENGINE"
"""``edge`` or ``local``: the embedded engine when no Qdrant server URL is given."""
Engine = Literal["edge", "local"]
ENGINES: tuple[Engine, ...] = ("edge", "local")


def open_store(
    path: str | os.PathLike[str] | None = None,
    *,
    url: str | None = None,
    engine: str | None = None,
    embedder: Embedder | None = None,
) -> EdgeMemoryStore | QdrantMemoryStore:
    """A store on the Qdrant server at ``url``, or embedded in the folder ``path``.

    ``engine`` (default: ``$TURNLOG_MEMORY_ENGINE``, else chosen from the folder): ``edge``
    (Qdrant Edge, the default for a new folder) or ``local`` (qdrant-client's local mode,
    the default for a folder that already holds a local-mode store)."""
    if url:
        from .qdrant import QdrantMemoryStore

        return QdrantMemoryStore(embedder, url=url)
    made_by_local_mode = path is not None and is_local_mode(Path(path))
    chosen = engine or os.environ.get(ENGINE_ENV) or ("local" if made_by_local_mode else "edge")
    if chosen == "local":
        from .qdrant import QdrantMemoryStore

        return QdrantMemoryStore(embedder, path=str(path)) if path else QdrantMemoryStore(embedder)
    if chosen == "edge":
        from .edge import EdgeMemoryStore

        return EdgeMemoryStore(embedder, path=str(path) if path else None)
    raise ConfigurationError(
        f"memory engine {chosen!r} is not one of {list(ENGINES)} (set {ENGINE_ENV}=edge or local, "
        "or give a Qdrant server URL)"
    )


def is_local_mode(path: Path) -> bool:
    """Whether ``path`` holds a store of qdrant-client's local mode (its meta.json and collections)."""
    return (path / "meta.json").is_file() and (path / "collection").is_dir()
