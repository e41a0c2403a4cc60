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

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import MalformedEventError

PREFIX = "tlenc1:"
"""The marker and the format's version: 1 is AES-256-GCM, 12-byte nonce, 16-byte tag."""
NONCE = 12
_NONCES_PER_READ = 256
_nonces: list[bytes] = []
"""Random nonces read ahead: one ``os.urandom`` call serves 256 values (``list.pop`` is
atomic, so threads share it); a forked child starts with none (it would repeat the parent's)."""
os.register_at_fork(after_in_child=_nonces.clear)


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
    nonce = _nonce()
    return PREFIX + base64.b64encode(nonce + key.encrypt(nonce, text.encode(), aad)).decode("ascii")


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def open_sealed(key: AESGCM, value: str, aad: bytes, where: str) -> str:
    """The plaintext of a sealed value; MalformedEventError (naming ``where``) if it is damaged
    or was not sealed for this session, event and field."""
    try:
        raw = base64.b64decode(value[len(PREFIX) :], validate=True)
        return key.decrypt(raw[:NONCE], raw[NONCE:], aad).decode()
    except (binascii.Error, InvalidTag, ValueError) as exc:
        raise MalformedEventError(
            f"{where}: the encrypted value does not open with its session's key "
            f"({type(exc).__name__}): it is damaged, or was copied from another event or field"
        ) from exc
