"""Compression of the embedded log's event values with a shipped zstd dictionary.

An event record is small (100-300 bytes) and mostly the same field contents over and over
(state names, producers, tool names, snapshot JSON keys), too little for a compressor to learn
from within one record. A dictionary trained once on a corpus of turnlog events
(``python -m turnlog.engine.log.zdict``, which writes ``events-<id>.zdict`` next to this file) gives it
that context. Each stored value is either the Avro record as the codec wrote it (it starts with
the single-object marker ``C3 01``: rows written before compression, or values compression did
not shrink) or a zstd frame that names its dictionary by id, so a log stays readable when a
later release ships another dictionary, and an old file opens and reads as it is.

The dictionary is trained on sessions generated here with their own texts, not on any
benchmark's workload (bench/README.md measures both with and without it).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path
from typing import AsyncIterator

import zstandard

from ..errors import MalformedEventError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DICT_ID = 1
"""The dictionary new values are compressed with; every shipped one stays readable."""
LEVEL = 3
WINDOW_LOG, HASH_LOG, CHAIN_LOG = 15, 13, 14
"""Level 3's match finder with tables sized for what it compresses: an append's records (1-4
KB) against the 32 KB dictionary. Level 3's defaults (a 2 MB window, tables of 128K and 64K
entries) are cold in the cache by the next append, so every call paid for the misses: 36 -> 18
us a frame with caches flushed between calls, the bytes 0.1 % smaller (bench/README.md §1,
item 7)."""
HERE = Path(__file__).resolve().parent


def dictionary_path(dict_id: int) -> Path:
    return HERE / f"events-{dict_id}.zdict"


@cache
def _dictionary(dict_id: int) -> zstandard.ZstdCompressionDict:
    path = dictionary_path(dict_id)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MalformedEventError(
            f"a log value is compressed with zstd dictionary {dict_id}, which this turnlog does not ship "
            f"({path} is missing); it was written by a newer turnlog: upgrade to read it"
        ) from None
    return zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_FULLDICT)


class _PerThread(threading.local):
    """zstd (de)compressors are not safe to share between threads: one of each per thread,
    made on first use."""

    def __init__(self) -> None:
        self.compressor: zstandard.ZstdCompressor | None = None
        self.decompressors: dict[int, zstandard.ZstdDecompressor] = {}


_local = _PerThread()


def pack(value: bytes) -> bytes:
    """``value`` as stored: compressed with the dictionary if that makes it shorter."""
    compressor = _local.compressor
    if compressor is None:
        params = zstandard.ZstdCompressionParameters.from_level(
            LEVEL,
            window_log=WINDOW_LOG,
            hash_log=HASH_LOG,
            chain_log=CHAIN_LOG,
            write_checksum=False,
            write_content_size=True,
            write_dict_id=True,  # unpack finds the dictionary by the frame's id
        )
        compressor = _local.compressor = zstandard.ZstdCompressor(
            compression_params=params, dict_data=_dictionary(DICT_ID)
        )
    packed = compressor.compress(value)
    return packed if len(packed) < len(value) else value


def unpack(stored: bytes) -> bytes:
    """The codec's record from a stored value (compressed or not)."""
    if stored[:4] != ZSTD_MAGIC:
        return stored
    try:
        dict_id = zstandard.get_frame_parameters(stored).dict_id
        decompressor = _local.decompressors.get(dict_id)
        if decompressor is None:  # dictionary id 0: a frame made without one
            decompressor = zstandard.ZstdDecompressor(dict_data=_dictionary(dict_id) if dict_id else None)
            _local.decompressors[dict_id] = decompressor
        return decompressor.decompress(stored)
    except zstandard.ZstdError as exc:
        raise MalformedEventError(f"corrupt compressed value ({len(stored)} bytes): {exc}") from exc


# -- training --------------------------------------------------------------------------------

WORDS = (
    "invoice refund shipment parcel account password reset billing plan upgrade cancel report "
    "weekly revenue region customer ticket priority deploy rollback server latency error retry "
    "calendar meeting tomorrow flight hotel booking seat window aisle price quote discount "
    "the a of to and in for on with is was please could you check my our why when how what"
).split()


def _sentence(rng: random.Random, lo: int = 4, hi: int = 30) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."


async def corpus(sessions: int = 24, turns: int = 30, seed: int = 1) -> list[bytes]:
    """Event records of generated sessions: varied texts, 0-3 tool calls a turn over four tools,
    failures, several agents; as the engine writes them (snapshots included)."""
    from ..agent import Agent, AgentDirectory
    from ..events import ToolCallSpec
    from ..models.base import Model, ModelChunk, ModelRequest, ModelResponse, Usage
    from ..session import AgentSessions
    from ..tools import tool
    from .sqlite import SqliteEventLog
    from .sqlite_layout import all_records

    rng = random.Random(seed)

    class VariedModel(Model):
        name = "corpus-model"

        async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
            since_user = 0
            for m in reversed(request.messages):
                if m.role == "user":
                    break
                since_user += m.role == "tool"
            if since_user < rng.choice([0, 1, 1, 2, 3]):
                name = rng.choice(["search_orders", "get_weather", "create_ticket", "convert"])
                args = {"query": _sentence(rng, 1, 5), "limit": rng.randint(1, 50)}
                spec = ToolCallSpec(f"call_{rng.getrandbits(40):x}", name, json.dumps(args))
                usage = Usage(rng.randint(50, 4000), 20)
                yield ModelResponse(text="", tool_calls=(spec,), usage=usage, finish_reason="tool_calls")
            else:
                yield ModelResponse(text=_sentence(rng, 5, 60), usage=Usage(rng.randint(50, 4000), 80))

    @tool(idempotent=True)
    async def search_orders(query: str, limit: int = 10) -> dict:
        """Search orders."""
        return {"query": query, "hits": [{"id": f"O-{rng.randint(1, 99999)}", "total": rng.random()}]}

    @tool(idempotent=True)
    async def get_weather(query: str, limit: int = 1) -> dict:
        """Weather."""
        return {"city": query, "celsius": rng.randint(-10, 35)}

    @tool()
    async def create_ticket(query: str, limit: int = 1) -> dict:
        """Open a ticket."""
        if rng.random() < 0.2:
            raise RuntimeError("ticket service unavailable")
        return {"ticket": f"T-{rng.randint(1, 9999)}", "summary": query}

    @tool(idempotent=True)
    def convert(query: str, limit: int = 1) -> str:
        """Convert."""
        return _sentence(rng, 2, 10)

    tools = [search_orders, get_weather, create_ticket, convert]
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteEventLog(Path(tmp) / "corpus.db", compress=False)
        agents = [Agent.build(name, VariedModel(), tools) for name in ("support", "travel", "ops")]
        api = AgentSessions(log, AgentDirectory(agents))
        for s in range(sessions):
            sid = (await api.create_session(agents[s % 3].agent_id, f"user-{s}")).session_id
            for _ in range(rng.randint(turns // 2, turns)):
                async for _item in api.send_user_message(sid, _sentence(rng)):
                    pass
        records = all_records(log._db)
        await log.close()
    return records


Sample = bytes | bytearray | memoryview


def train(samples: list[Sample], size: int = 32 * 1024, dict_id: int = DICT_ID) -> bytes:
    """A zstd dictionary of ``size`` bytes for ``samples``."""
    trained = zstandard.train_dictionary(size, samples, dict_id=dict_id, level=LEVEL)
    return trained.as_bytes()


def main() -> None:
    dict_id = int(sys.argv[1]) if len(sys.argv) > 1 else DICT_ID
    samples: list[Sample] = list(asyncio.run(corpus()))
    data = train(samples, dict_id=dict_id)
    path = dictionary_path(dict_id)
    path.write_bytes(data)
    raw = sum(map(len, samples))
    print(f"trained on {len(samples)} events ({raw} bytes); wrote {path.name} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
