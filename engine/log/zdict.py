"""Compression of the embedded log's event values with a shipped zstd dictionary.

An event record is small (100-300 bytes) and mostly the same field contents over and over
(state names, producers, tool names, snapshot JSON keys), too little for a compressor to learn
from within one record. A dictionary trained once on a corpus of turnlog events
(``python scripts/train_zdict.py``, which writes ``events-<id>.zdict`` next to this file) gives
it that context. Each stored value is either the Avro record as the codec wrote it (it starts with
the single-object marker ``C3 01``: rows written before compression, or values compression did
not shrink) or a zstd frame that names its dictionary by id, so a log stays readable when a
later release ships another dictionary, and an old file opens and reads as it is.
"""

from __future__ import annotations

import threading
from functools import cache
from importlib import resources
from pathlib import Path

import zstandard

from ..errors import MalformedEventError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DICT_ID = 1
"""The dictionary new values are compressed with; every shipped one stays readable."""
LEVEL = 3
WINDOW_LOG, HASH_LOG, CHAIN_LOG = 15, 13, 14
"""Level 3's match finder with tables sized for what it compresses: an append's records (1-4
KB) against the 32 KB dictionary. Level 3's defaults (a 2 MB window, tables of 128K and 64K
entries) are cold in the cache by the next append, so every call would pay for the misses
(bench/README.md §1 has the figures)."""
HERE = Path(str(resources.files(__package__)))
"""Where the shipped dictionaries are (package data beside this module)."""


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
