"""Long-term memory on real Qdrant engines with the real offline embedder (seed §3.3): Qdrant Edge
in-process (the embedded default), qdrant-client's local mode, and a server when one is given."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.openai_server import free_port, serve_openai
from turnlog.engine.errors import ConfigurationError, InputError, MemoryStoreError
from turnlog.engine.memory.dedup import DUPLICATE_THRESHOLD, same_fact
from turnlog.engine.memory.edge import EdgeMemoryStore
from turnlog.engine.memory.embedders import OpenAIEmbeddings, UniversalSentenceEncoder
from turnlog.engine.memory.qdrant import QdrantMemoryStore
from turnlog.engine.memory.stores import open_store

CORPUS = Path(__file__).parent / "corpus"
PAIRS: list[dict[str, Any]] = json.loads((CORPUS / "memory_pairs.json").read_text())["pairs"]
QUERIES: dict[str, Any] = json.loads((CORPUS / "memory_queries.json").read_text())


@pytest.fixture(scope="session")
def embedder() -> UniversalSentenceEncoder:
    """One loaded model for the whole run (loading takes about two seconds)."""
    return UniversalSentenceEncoder()


Store = EdgeMemoryStore | QdrantMemoryStore


@pytest.fixture(params=["edge", "local"])
def engine(request: pytest.FixtureRequest) -> str:
    """The embedded engines: Qdrant Edge (the default) and qdrant-client's local mode."""
    return str(request.param)


def embedded(engine: str, embedder: Any, path: Path) -> Store:
    store = open_store(path, engine=engine, embedder=embedder)
    assert isinstance(store, (EdgeMemoryStore, QdrantMemoryStore))
    return store


@pytest.fixture(params=["edge", "local", "server"])
async def memories(
    request: pytest.FixtureRequest, embedder: UniversalSentenceEncoder, tmp_path: Path
) -> AsyncIterator[Store]:
    """Qdrant Edge and Qdrant local mode on a temp path; and a Qdrant server (a fresh collection)
    when TURNLOG_QDRANT_URL names one (no server binary ships here, so it is skipped otherwise)."""
    store: Store
    if request.param in ("edge", "local"):
        store = embedded(request.param, embedder, tmp_path / "qdrant")
    elif url := os.environ.get("TURNLOG_QDRANT_URL"):
        store = QdrantMemoryStore(embedder, url=url, collection=f"test_{uuid.uuid4().hex}")
    else:
        pytest.skip("set TURNLOG_QDRANT_URL to run the memory tests on a Qdrant server")
    try:
        yield store
    finally:
        await store.close()


def test_the_labelled_set_is_big_and_mixed() -> None:
    labels = {(p["label"], p["lang"]) for p in PAIRS}
    assert len(PAIRS) >= 40
    assert {("duplicate", lang) for lang in ("zh", "en", "mixed")} <= labels
    assert {("distinct", lang) for lang in ("zh", "en", "mixed")} <= labels


async def test_dedup_merges_paraphrases_and_keeps_different_facts_apart(memories: Store) -> None:
    """Each pair goes through the store: write a, then b; b merged iff one current memory remains.

    Measured with the default embedder and threshold: 28 of 30 paraphrases merge (the two misses
    swap one span inside an unchanged frame, which the contrast veto reads as a different fact),
    32 of 32 different facts stay apart.
    """
    misses = []
    merged_dup = kept_apart = 0
    for i, pair in enumerate(PAIRS):
        user = f"pair-{i}"
        await memories.remember(user, pair["a"], "conclusion", time_ms=1000)
        await memories.remember(user, pair["b"], "conclusion", time_ms=2000)
        merged = await memories.count(user) == 1
        if pair["label"] == "duplicate":
            merged_dup += merged
        else:
            kept_apart += not merged
        if merged != (pair["label"] == "duplicate"):
            misses.append(f"{pair['label']}: {pair['a']} | {pair['b']} ({pair['note']})")
    duplicates = sum(p["label"] == "duplicate" for p in PAIRS)
    distinct = len(PAIRS) - duplicates
    print(f"\nmerged {merged_dup}/{duplicates} duplicates, kept apart {kept_apart}/{distinct} distinct pairs")
    print("misses:\n  " + "\n  ".join(misses))
    assert merged_dup / duplicates >= 0.9, misses
    assert kept_apart / distinct >= 0.95, misses


def test_numbers_and_contrast_pairs_veto_a_merge_whatever_the_cosine() -> None:
    assert not same_fact("Order 1042 was lost by the carrier", "Order 1043 was lost by the carrier", 0.99)
    assert not same_fact("用户偏好使用顺丰快递发货", "用户偏好使用圆通快递发货", 0.99)
    assert same_fact("The user prefers dark mode.", "the user prefers dark mode", 0.1)
    assert same_fact("订单1042被承运商弄丢了", "承运商丢失了1042号订单", DUPLICATE_THRESHOLD)
    assert not same_fact("订单1042被承运商弄丢了", "承运商丢失了1042号订单", DUPLICATE_THRESHOLD - 0.01)


async def test_search_filters_by_tag_and_minimum_score(memories: Store) -> None:
    await memories.remember("u1", "The user prefers DHL for shipping", "preference")
    await memories.remember("u1", "Order 1042 was lost by the carrier", "conclusion")
    await memories.remember("u1", "Refund orders that are more than 5 days late", "agreement")

    everything = await memories.search("u1", "which carrier ships the parcels?", limit=10)
    assert len(everything) == 3
    assert everything[0].text == "The user prefers DHL for shipping"
    assert [m.score for m in everything] == sorted((m.score for m in everything), reverse=True)

    tagged = await memories.search("u1", "which carrier ships the parcels?", tags=["conclusion", "agreement"])
    assert {m.tag for m in tagged} == {"conclusion", "agreement"}

    floor = (everything[0].score + everything[1].score) / 2
    strict = await memories.search("u1", "which carrier ships the parcels?", min_score=floor)
    assert [m.text for m in strict] == ["The user prefers DHL for shipping"]
    assert all(m.score >= floor for m in strict)


async def test_a_restatement_supersedes_and_the_old_version_stays_in_history(
    memories: Store,
) -> None:
    first = await memories.remember("u1", "用户偏好使用顺丰快递发货", "preference", time_ms=1000)
    second = await memories.remember("u1", "用户希望发货都用顺丰", "preference", source="s2", time_ms=2000)

    assert second.superseded is not None
    assert second.superseded.memory_id == first.memory.memory_id
    assert second.superseded.valid_to_ms == 2000
    assert second.memory.supersedes == first.memory.memory_id

    found = await memories.search("u1", "用户偏好使用顺丰快递发货", limit=10)
    assert [m.memory_id for m in found] == [second.memory.memory_id]

    for member in (first.memory.memory_id, second.memory.memory_id):
        versions = await memories.history("u1", member)
        assert [v.text for v in versions] == ["用户偏好使用顺丰快递发货", "用户希望发货都用顺丰"]
        assert [v.valid_to_ms for v in versions] == [2000, None]


async def test_rewriting_the_same_fact_changes_nothing(memories: Store) -> None:
    """What makes a consumer's re-run idempotent: the same text, or an older restatement of a
    newer version, writes nothing."""
    first = await memories.remember("u1", "Group the sales report by channel", "preference", time_ms=1000)
    again = await memories.remember("u1", "group the sales report by channel.", "preference", time_ms=1000)
    assert again.memory.memory_id == first.memory.memory_id and again.superseded is None

    newer = await memories.remember(
        "u1", "The sales report should be grouped by channel", "preference", time_ms=3000
    )
    assert newer.superseded is not None
    replay = await memories.remember("u1", "Group the sales report by channel", "preference", time_ms=1000)
    assert replay.memory.memory_id == newer.memory.memory_id
    assert await memories.count("u1") == 1
    assert await memories.count("u1", current_only=False) == 2


async def test_a_user_never_gets_another_users_memories(memories: Store) -> None:
    secret = await memories.remember("alice", "Alice's bank card ends in 4242", "preference")
    await memories.remember("bob", "Bob prefers email", "preference")

    assert await memories.search("bob", "Alice's bank card ends in 4242", limit=10) != []
    assert all(m.user_id == "bob" for m in await memories.search("bob", "Alice's bank card ends in 4242"))
    assert await memories.search("carol", "Alice's bank card ends in 4242") == []
    assert await memories.history("bob", secret.memory.memory_id) == []
    same_text = await memories.remember("bob", "Alice's bank card ends in 4242", "preference")
    assert same_text.superseded is None and same_text.memory.memory_id != secret.memory.memory_id
    assert await memories.count("alice") == 1


async def test_memories_persist_across_reopening_the_local_path(
    engine: str, embedder: UniversalSentenceEncoder, tmp_path: Path
) -> None:
    path = tmp_path / "qdrant"
    first = embedded(engine, embedder, path)
    written = await first.remember("u1", "The user's default warehouse is in Shanghai", "preference")
    await first.close()

    second = embedded(engine, embedder, path)
    try:
        found = await second.search("u1", "用户的默认仓库在哪里？")
        assert [m.memory_id for m in found] == [written.memory.memory_id]
    finally:
        await second.close()


async def test_mixed_chinese_and_english_queries_find_their_fact_first(memories: Store) -> None:
    ids = {}
    for fact in QUERIES["facts"]:
        written = await memories.remember("u1", fact["text"], fact["tag"])
        ids[written.memory.memory_id] = fact["id"]
    assert await memories.count("u1") == len(QUERIES["facts"])
    hits, misses = 0, []
    for probe in QUERIES["queries"]:
        top = await memories.search("u1", probe["query"], limit=1)
        if top and ids[top[0].memory_id] == probe["expect"]:
            hits += 1
        else:
            misses.append((probe["query"], top[0].text if top else None))
    print(f"\nrank-1 hits {hits}/{len(QUERIES['queries'])}; misses {misses}")
    assert hits >= 9, misses


async def test_bad_writes_and_settings_say_what_to_do(memories: Store, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="MemoryTag"):
        await memories.remember("u1", "a fact", "gossip")
    with pytest.raises(InputError, match="user_id"):
        await memories.remember("", "a fact", "preference")
    with pytest.raises(ConfigurationError, match="one of path="):
        QdrantMemoryStore(memories.embedder, path=str(tmp_path / "a"), url="http://127.0.0.1:6333")


async def test_one_process_per_local_path(
    engine: str, embedder: UniversalSentenceEncoder, tmp_path: Path
) -> None:
    first = embedded(engine, embedder, tmp_path / "q")
    second = embedded(engine, embedder, tmp_path / "q")
    try:
        await first.remember("u1", "a fact", "preference")
        with pytest.raises(MemoryStoreError, match="url="):
            await second.search("u1", "a fact")
    finally:
        await first.close()
        await second.close()


class _Other:
    name = "other"
    dim = 8

    def embed(self, texts: Any) -> np.ndarray:
        return np.ones((len(texts), 8), dtype=np.float32) / np.sqrt(8)


async def test_a_collection_refuses_another_embedders_vectors(
    engine: str, embedder: UniversalSentenceEncoder, tmp_path: Path
) -> None:
    path = tmp_path / "q"
    first = embedded(engine, embedder, path)
    await first.remember("u1", "a fact", "preference")
    await first.close()
    other = embedded(engine, _Other(), path)
    try:
        with pytest.raises(ConfigurationError, match="512-dimensional"):
            await other.search("u1", "a fact")
    finally:
        await other.close()


def test_openai_embeddings_through_the_sdk_match_the_local_model(embedder: UniversalSentenceEncoder) -> None:
    texts = ["用户偏好使用顺丰快递发货", "The user prefers DHL", "订单1042", "Reports in Chinese", "x"]
    with serve_openai([], embed=embedder.embed) as server:
        remote = OpenAIEmbeddings("use-v3", base_url=server.base_url, api_key="k", batch_size=2)
        try:
            vectors = remote.embed(texts)
            assert remote.dim == 512
        finally:
            remote.close()
        assert [len(r["input"]) for r in server.embedding_requests] == [2, 2, 1]
    assert vectors.shape == (5, 512)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors, embedder.embed(texts), atol=1e-5)


def test_openai_embeddings_errors_name_the_endpoint() -> None:
    with serve_openai([]) as server:
        remote = OpenAIEmbeddings("chat-only", base_url=server.base_url, api_key="k", max_retries=0)
        try:
            with pytest.raises(MemoryStoreError, match="HTTP 404.*serves embeddings"):
                remote.embed(["a"])
        finally:
            remote.close()


class _ThreadRecorder:
    """The real embedder, noting which thread each call runs on."""

    def __init__(self, inner: UniversalSentenceEncoder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.threads: set[int] = set()

    def embed(self, texts: Any) -> np.ndarray:
        self.threads.add(threading.get_ident())
        return self.inner.embed(texts)


async def test_embedding_and_qdrant_stay_off_the_event_loop_thread(
    engine: str, embedder: UniversalSentenceEncoder, tmp_path: Path
) -> None:
    recorder = _ThreadRecorder(embedder)
    store = embedded(engine, recorder, tmp_path / "q")
    try:
        await store.remember("u1", "The user prefers DHL", "preference")
        await store.search("u1", "carrier")
    finally:
        await store.close()
    assert recorder.threads and threading.get_ident() not in recorder.threads


async def test_an_unreachable_server_says_what_to_check(embedder: UniversalSentenceEncoder) -> None:
    store = QdrantMemoryStore(embedder, url=f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(MemoryStoreError, match="server is running"):
            await store.search("u1", "anything")
    finally:
        await store.close()


async def test_a_store_on_an_embeddings_endpoint(
    engine: str, embedder: UniversalSentenceEncoder, tmp_path: Path
) -> None:
    with serve_openai([], embed=embedder.embed) as server:
        remote = OpenAIEmbeddings("use-v3", base_url=server.base_url, api_key="k")
        store = embedded(engine, remote, tmp_path / "q")
        try:
            await store.remember("u1", "用户偏好使用顺丰快递发货", "preference")
            found = await store.search("u1", "Which courier should I use?")
        finally:
            await store.close()
            remote.close()
    assert [m.text for m in found] == ["用户偏好使用顺丰快递发货"]
    # the write learns the dimension from its own vectors: no probe call
    assert len(server.embedding_requests) == 2


class CountingEmbedder:
    """The real embedder, noting every text it was asked to embed."""

    def __init__(self, inner: UniversalSentenceEncoder) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.texts: list[str] = []

    def embed(self, texts: Any) -> np.ndarray:
        self.texts += list(texts)
        return self.inner.embed(texts)


async def test_a_search_for_a_user_with_no_memories_embeds_nothing(
    engine: str, embedder: UniversalSentenceEncoder, tmp_path: Path
) -> None:
    counting = CountingEmbedder(embedder)
    store = embedded(engine, counting, tmp_path / "qdrant")
    try:
        assert await store.search("alice", "Which carrier do I prefer?") == []
        assert counting.texts == []  # no memories: the query is not embedded
        await store.remember("alice", "The user prefers the carrier DHL.", "preference", time_ms=1000)
        assert await store.search("bob", "Which carrier do I prefer?") == []
        assert counting.texts == ["The user prefers the carrier DHL."]
        found = await store.search("alice", "Which carrier do I prefer?", min_score=0.1)
        assert [m.text for m in found] == ["The user prefers the carrier DHL."]
        assert counting.texts[-1] == "Which carrier do I prefer?"
    finally:
        await store.close()
