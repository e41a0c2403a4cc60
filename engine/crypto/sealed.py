"""An encrypted value as the log stores it: a self-describing string.

``tlenc1:`` + base64 of the 12-byte nonce and the AES-256-GCM ciphertext with its 16-byte tag.
The associated data binds it to its session, event and field, so a value copied into another
event, session or field does not decrypt. A string stays a string: the Avro schemas do not
change, and stock readers decode every record, seeing ciphertext where content was. A value
without the prefix is plaintext from a log written before encryption, and is read as it is.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from binascii import b2a_base64

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import MalformedEventError

PREFIX = "tlenc1:"
"""The marker and the format's version: 1 is AES-256-GCM, 12-byte nonce, 16-byte tag, over the
value's UTF-8 or, from ``COMPRESS_FROM`` bytes, its zstd frame when that is shorter."""
REF = PREFIX + "="
"""``tlenc1:=<field>``: the same plaintext as the event's sealed ``<field>`` (fields.TWINS)."""
COMPRESS_FROM = 512
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
NONCE = 12
_NONCES_PER_READ = 256
_nonces: list[bytes] = []
"""Random nonces read ahead: one ``os.urandom`` call serves 256 values (``list.pop`` is
atomic, so threads share it); a forked child starts with none (it would repeat the parent's)."""
os.register_at_fork(after_in_child=_nonces.clear)


class _PerThread(threading.local):
    """zstd (de)compressors are not safe to share between threads: one of each per thread."""

    compressor: zstandard.ZstdCompressor | None = None
    decompressor: zstandard.ZstdDecompressor | None = None


_zstd = _PerThread()


def _nonce() -> bytes:
    try:
        return _nonces.pop()
    except IndexError:
        raw = os.urandom(NONCE * _NONCES_PER_READ)
        _nonces.extend(raw[i : i + NONCE] for i in range(0, len(raw), NONCE))
        return _nonces.pop()


def associated(session_id: str, event_id: str, field: str) -> bytes:
    """What a value is bound to: its session, its event and its field."""
    return f"{session_id}\x1f{event_id}\x1f{field}".encode()


def seal(key: AESGCM, text: str, aad: bytes) -> str:
    data = text.encode()
    if len(data) >= COMPRESS_FROM:
        data = _compressed(data)
    nonce = _nonce()
    return PREFIX + b2a_base64(nonce + key.encrypt(nonce, data, aad), newline=False).decode("ascii")


def _compressed(data: bytes) -> bytes:
    """``data`` as a zstd frame if that is a quarter shorter: ciphertext does not compress, so a
    large value (a snapshot's state, a long tool result) is compressed before it is encrypted,
    or the log would store it whole. UTF-8 never starts with the frame's magic (``28 b5 2f fd``:
    0xb5 cannot start a character), so ``open_sealed`` tells the two apart."""
    compressor = _zstd.compressor
    if compressor is None:
        compressor = _zstd.compressor = zstandard.ZstdCompressor(level=3, write_checksum=False)
    packed = compressor.compress(data)
    return packed if len(packed) * 4 < len(data) * 3 else data


def _plain(data: bytes) -> str:
    if data[:4] != ZSTD_MAGIC:
        return data.decode()
    decompressor = _zstd.decompressor
    if decompressor is None:
        decompressor = _zstd.decompressor = zstandard.ZstdDecompressor()
    return decompressor.decompress(data).decode()


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def open_sealed(key: AESGCM, value: str, aad: bytes, where: str) -> str:
    """The plaintext of a sealed value; MalformedEventError (naming ``where``) if it is damaged
    or was not sealed for this session, event and field."""
    try:
        raw = base64.b64decode(value[len(PREFIX) :], validate=True)
        return _plain(key.decrypt(raw[:NONCE], raw[NONCE:], aad))
    except (binascii.Error, InvalidTag, ValueError, zstandard.ZstdError) as exc:
        raise MalformedEventError(
            f"{where}: the encrypted value does not open with its session's key "
            f"({type(exc).__name__}): it is damaged, or was copied from another event or field"
        ) from exc
