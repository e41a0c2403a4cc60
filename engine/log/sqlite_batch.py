"""One append as the embedded log stores it (layout 3): a row per append, not per event (a
session's consecutive held appends share one: engine.log.sqlite_held).

An append is one session's next events, committed together. Layout 3 keeps them together: one
``batches`` row holds the first event's position and version and the number of events, and one
stored value holds all their records, each as the codec wrote it behind its length (an unsigned
varint). The value is compressed as a whole with the shipped dictionary (engine.log.zdict) when
that makes it shorter: the records of one step share their session id, turn id, tool and state
names, so a frame over all of them is about a third smaller than a frame per record, and the
table and its indexes hold one entry per append instead of one per event.

The records of a batch are split without decoding them: a reader decodes only the events it
returns, so a corrupt record costs only itself (a corrupt frame costs its batch).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import EventError, MalformedEventError
from ..events import Event
from .sealing import PLAIN, RecordCodec
from .zdict import pack, unpack


def delimited_events(events: Sequence[Event], records: RecordCodec = PLAIN) -> bytes:
    """The events' records (through the log's sealer) behind their lengths, not compressed.
    Bodies concatenate: two appends' bodies, one after the other, are the body of their events
    together."""
    return _delimited(records.encode_all(events))


def pack_batch(records: Sequence[bytes], *, compress: bool) -> bytes:
    """The stored value of one append's records (in version order)."""
    body = _delimited(records)
    return pack(body) if compress else body


def _delimited(records: Sequence[bytes]) -> bytes:
    """The records, each behind its length (an unsigned varint)."""
    body = bytearray()
    for record in records:
        _write_length(body, len(record))
        body += record
    return bytes(body)


def split_batch(stored: bytes) -> list[bytes]:
    """The records of a stored batch value, in version order. MalformedEventError if the value
    cannot be decompressed or its lengths do not add up (the caller names the batch)."""
    body = unpack(stored)
    records: list[bytes] = []
    pos, size = 0, len(body)
    while pos < size:
        n = body[pos]
        pos += 1
        if n >= 0x80:
            n, pos = _length_tail(body, pos, n)
        end = pos + n
        if end > size:
            raise MalformedEventError(
                f"corrupt batch: a record of {n} bytes at byte {pos} runs past the value's end ({size} bytes)"
            )
        records.append(body[pos:end])
        pos = end
    return records


def _write_length(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _length_tail(body: bytes, pos: int, first: int) -> tuple[int, int]:
    n, shift = first & 0x7F, 7
    while True:
        if pos >= len(body) or shift > 35:
            raise MalformedEventError(f"corrupt batch: a record length at byte {pos} does not end")
        b = body[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


def records_at(partition: int, position: int, value: bytes) -> list[bytes]:
    """A stored batch's records; an error names where the batch starts."""
    try:
        return split_batch(value)
    except EventError as exc:
        raise type(exc)(f"partition {partition} offsets from {position}: {exc}") from exc


def decode_at(partition: int, position: int, record: bytes) -> Event:
    """A record decoded as stored (no sealer): what the log reads for its own bookkeeping."""
    return PLAIN.decode_at(partition, position, record)
