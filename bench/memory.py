#!/usr/bin/env python
"""Long-term memory: write and retrieval latency, Qdrant Edge against Qdrant local mode (issues 8, 20).

    PYTHONPATH=. .venv/bin/python bench/memory.py                          # 10,000 and 100,000 memories
    PYTHONPATH=. .venv/bin/python bench/memory.py --memories 2000 --writes 50 --searches 100
    PYTHONPATH=. .venv/bin/python bench/memory.py --engines edge --memories 100000
    PYTHONPATH=. .venv/bin/python bench/memory.py --shards 1               # local mode in one collection

For each size and each engine (``EdgeMemoryStore``, the embedded default, and ``QdrantMemoryStore``
in local mode, both on disk in a temp dir) with the default embedder (USE v3, offline): the
preload is a bulk insert (``remember_many``: no duplicate check) of synthetic Chinese and English
facts spread over ``--users`` users, embedded once per size and given to every engine as
vectors. Then, timed one at a time, the same operations in the same order on each engine:

* embed: the embedder alone on one text (what every write and search pays first);
* write: ``remember`` of a new fact (embed + the dedup look-up among the user's current
  memories + the upsert, or the supersede);
* search: ``search`` for a user (embed + the filtered query), limit 5;
* search, engine only: the same query with the vector already computed.

p50 / p95 in ms. Results: a table on stdout and JSON in bench/results/memory.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(REPO), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import engine_version  # noqa: E402

from turnlog.engine.memory.base import Memory  # noqa: E402
from turnlog.engine.memory.edge import EdgeMemoryStore  # noqa: E402
from turnlog.engine.memory.embedders import UniversalSentenceEncoder  # noqa: E402
from turnlog.engine.memory.qdrant import QdrantMemoryStore  # noqa: E402

CARRIERS = ["DHL", "FedEx", "UPS", "顺丰", "圆通", "中通", "韵达", "EMS"]
CITIES = ["Shanghai", "Beijing", "Shenzhen", "Hangzhou", "上海", "北京", "广州", "成都"]
TEMPLATES = [
    "The user prefers {carrier} for orders to {city}",
    "Order {n} was lost by {carrier}",
    "用户希望发往{city}的订单使用{carrier}",
    "订单{n}的退款已经在{d}天内处理完毕",
    "Refund orders that are more than {d} days late",
    "客户{n}一般在周{d}下单最多",
    "The weekly report for warehouse {n} goes out on day {d}",
    "{city}仓库的支付失败率是{d}%",
]
TAGS = ["preference", "conclusion", "agreement"]
QUERIES = [
    "which carrier should ship this order?",
    "订单丢了怎么办？",
    "when are refunds due?",
    "周报什么时候发？",
    "哪个仓库支付失败多？",
    "what does the user prefer?",
]


def fact(rng: random.Random) -> str:
    return rng.choice(TEMPLATES).format(
        carrier=rng.choice(CARRIERS),
        city=rng.choice(CITIES),
        n=rng.randint(1000, 99999),
        d=rng.randint(1, 30),
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(values, 0.5), 2), "p95_ms": round(pct(values, 0.95), 2), "n": len(values)}


async def timed(fn: Any, *args: Any, **kwargs: Any) -> float:
    start = time.perf_counter()
    await fn(*args, **kwargs)
    return (time.perf_counter() - start) * 1000


async def run_engine(
    name: str,
    args: argparse.Namespace,
    embedder: UniversalSentenceEncoder,
    root: Path,
    preload: list[Memory],
    vectors: np.ndarray,
) -> dict[str, Any]:
    """One engine: preload, then the timed writes and searches (the same ones for every engine)."""
    store: EdgeMemoryStore | QdrantMemoryStore = (
        EdgeMemoryStore(embedder, path=str(root / name))
        if name == "edge"
        else QdrantMemoryStore(embedder, path=str(root / name), shards=args.shards)
    )
    users = sorted({m.user_id for m in preload})
    start = time.perf_counter()
    await store.remember_many(preload, vectors)
    preload_s = time.perf_counter() - start
    assert await store.count() == len(preload)
    rng = random.Random(11)
    writes = [
        await timed(store.remember, rng.choice(users), fact(rng), rng.choice(TAGS))
        for _ in range(args.writes)
    ]
    searches, engine_only = [], []
    for _ in range(args.searches):
        user, query = rng.choice(users), rng.choice(QUERIES)
        searches.append(await timed(store.search, user, query, limit=5))
        vector = embedder.embed([query])[0]
        engine_only.append(await timed(store._call, store._query, user, vector, (), 0.0, 5))
    total = await store.count(current_only=False)
    await store.close()
    result: dict[str, Any] = {
        "preload_s": round(preload_s, 1),
        "stored_after_writes": total,
        "write": summary(writes),
        "search": summary(searches),
        "search_engine_only": summary(engine_only),
    }
    if isinstance(store, QdrantMemoryStore):
        result["shards"] = store.shards
    return result


class Texts:
    """The preload's facts and their vectors: ``distinct`` texts (the first ``distinct`` of the
    seeded sequence), each embedded once and shared by every size, memory i taking text
    ``i % distinct``. With a prime ``distinct`` above the users count, no user holds a text
    twice; a search scores the same number of points as with all texts distinct."""

    def __init__(self, distinct: int) -> None:
        rng = random.Random(7)
        self.texts = [fact(rng) for _ in range(distinct)]
        self.tags = [rng.choice(TAGS) for _ in range(distinct)]
        self.vectors: np.ndarray | None = None
        self.embed_s = 0.0

    async def embedded(self, embedder: UniversalSentenceEncoder, count: int) -> np.ndarray:
        """Vectors for the first ``count`` texts (all of them once more than that are needed)."""
        if self.vectors is None or len(self.vectors) < min(count, len(self.texts)):
            start = time.perf_counter()
            embedder.batch_size = 256
            wanted = self.texts[: min(count, len(self.texts))] if self.vectors is None else self.texts
            self.vectors = await asyncio.to_thread(embedder.embed, wanted)
            embedder.batch_size = 64
            self.embed_s += time.perf_counter() - start
        return self.vectors


async def run_size(
    memories: int, args: argparse.Namespace, embedder: UniversalSentenceEncoder, root: Path, texts: Texts
) -> dict[str, Any]:
    users = [f"user-{i}" for i in range(args.users)]
    pool = await texts.embedded(embedder, memories)
    distinct = len(texts.texts)
    preload = [
        Memory(
            memory_id=f"{i:08x}-0000-4000-8000-000000000000",
            user_id=users[i % len(users)],
            text=texts.texts[i % distinct],
            tag=texts.tags[i % distinct],
            valid_from_ms=1,
        )
        for i in range(memories)
    ]
    vectors = pool[[i % distinct for i in range(memories)]]
    rng = random.Random(memories)
    embed = [await timed(asyncio.to_thread, embedder.embed, [fact(rng)]) for _ in range(args.searches)]
    engines = {}
    for name in args.engines:
        engines[name] = await run_engine(name, args, embedder, root / f"{memories}", preload, vectors)
        print(f"  {memories} memories, {name}: {engines[name]}", flush=True)
    return {
        "memories": memories,
        "users": args.users,
        "distinct_texts": min(distinct, memories),
        "embed": summary(embed),
        "engines": engines,
    }


ENGINE_NAMES = {"edge": "Qdrant Edge", "local": "local mode"}


def table(sizes: list[dict[str, Any]]) -> str:
    lines = [
        "| memories | operation | engine | p50 ms | p95 ms | n |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for size in sizes:
        n = f"{size['memories']:,}"
        e = size["embed"]
        lines.append(f"| {n} | embed one text (USE v3) | - | {e['p50_ms']} | {e['p95_ms']} | {e['n']} |")
        for op, label in (
            ("write", "write: remember (embed + dedup + upsert)"),
            ("search", "search: embed + filtered query, limit 5"),
            ("search_engine_only", "search, engine only (vector given)"),
        ):
            for name, result in size["engines"].items():
                s = result[op]
                lines.append(
                    f"| {n} | {label} | {ENGINE_NAMES[name]} | {s['p50_ms']} | {s['p95_ms']} | {s['n']} |"
                )
        for name, result in size["engines"].items():
            preload = f"{result['preload_s']} s"
            lines.append(
                f"| {n} | preload (bulk upsert, vectors given) | {ENGINE_NAMES[name]} | {preload} | | |"
            )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--engines", nargs="+", choices=sorted(ENGINE_NAMES), default=["edge", "local"])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument(
        "--distinct", type=int, default=9973, help="distinct texts embedded (0: one per memory); a prime"
    )
    parser.add_argument("--writes", type=int, default=100)
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument(
        "--shards", type=int, default=None, help="local mode's collections (default: the store's)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "memory.json")
    args = parser.parse_args()
    embedder = UniversalSentenceEncoder()
    start = time.perf_counter()
    embedder.embed(["warm-up"])
    load_s = time.perf_counter() - start
    sizes = []
    texts = Texts(args.distinct or max(args.memories))
    with tempfile.TemporaryDirectory() as tmp:
        for memories in args.memories:
            sizes.append(await run_size(memories, args, embedder, Path(tmp), texts))
    print(table(sizes))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    facts = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    load = os.getloadavg()
    out = {
        "engine": engine_version.fingerprint()["sha256_12"],
        **facts,
        "load_average_1m_at_end": round(load[0], 1),
        "model_load_s": round(load_s, 2),
        "embed_preload_s": round(texts.embed_s, 1),
        "sizes": sizes,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
