"""``ContentCipher``: encrypts an event's content fields with its session's data key before a
log encodes it, and opens them after the log decodes it (the ``engine.log.sealing.Sealer`` a
persisting log is given), so the fold, the turn loop and the projector see plaintext.

A session's data key is made when its first content is sealed (its user taken from the event
that opens the session, or for a fork from its origin's key), kept wrapped in the key store and
cached here unwrapped. Once the key is destroyed, a sealed value opens as erased
(``fields.ERASED``) and new content of the session is written erased. Another process's
erasure reaches this one two ways: a ``SessionErased`` this cipher seals or opens drops the key
at once, and ``reading()`` (called by a log before it decodes) asks the key store which
sessions were erased since it last asked.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from functools import partial
from typing import Callable

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import KeyStoreError
from ..events import (
    Event,
    SessionCreated,
    SessionErased,
    SessionForked,
    UserMessageReceived,
    now_ms,
)
from .compiled import Key, opener_of, sealer_of
from .fields import CONTENT, ERASED_TEXT, scrubbed
from .keystore import DataKey, KeyStore
from .master import KEY_BYTES, MasterKeys
from .sealed import PREFIX, associated, open_sealed, seal

CACHE = 65536
"""Unwrapped keys (and sessions known erased) a process keeps; the rest are read again."""


class ContentCipher:
    """Seals and opens content for one key store. ``recheck_s``: how often ``reading()`` asks
    the store for erasures by other processes (0: at every read; a local SQLite store answers in
    microseconds, a PostgreSQL one takes a round trip)."""

    def __init__(self, keys: KeyStore, master: MasterKeys, *, recheck_s: float = 0.0) -> None:
        self.keys = keys
        self.master = master
        self.recheck_s = recheck_s
        self._aeads: OrderedDict[str, AESGCM] = OrderedDict()
        self._erased: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._seq = keys.erased_since(1 << 62)[0]
        self._checked = time.monotonic()
        self._forget_listeners: list[Callable[[str], None]] = []

    # -- the log's side ------------------------------------------------------------------------

    def seal(self, event: Event) -> Event:
        """``event`` with its content encrypted (erased if its session's key is gone)."""
        if event.type not in CONTENT:
            if type(event) is SessionErased:
                self.forget(event.session_id)
            return event
        aead = self._aeads.get(event.session_id) or self._write_key(event)
        if aead is None:
            return scrubbed(event)
        return sealer_of(type(event))(event, aead)

    def open(self, event: Event) -> Event:
        """``event`` with its sealed values opened (erased if its key is gone); plaintext from a
        log written before encryption is left as it is."""
        if event.type not in CONTENT:
            if type(event) is SessionErased:
                self.forget(event.session_id)
            return event
        sid = event.session_id
        key: Key = self._aeads.get(sid)
        if key is None and sid not in self._erased:
            key = partial(self._read_key, sid)  # looked up only if a value is sealed
        return opener_of(type(event))(event, key)

    def erases(self, event: Event) -> bool:
        """Whether ``event`` erases its session (what was decoded of it must be scrubbed)."""
        return type(event) is SessionErased

    def scrub(self, event: Event) -> Event:
        return scrubbed(event)

    def reading(self) -> None:
        """Drop the keys of sessions other processes erased since the last check."""
        if self.recheck_s and time.monotonic() - self._checked < self.recheck_s:
            return
        seq, erased = self.keys.erased_since(self._seq)
        for sid in erased:
            self.forget(sid)
        self._seq, self._checked = seq, time.monotonic()

    def seal_text(self, session_id: str, text: str, label: str) -> str:
        """A value outside an event (a token delta on Kafka's live topic), bound to ``label``."""
        aead = self._aeads.get(session_id) or self._write_key(None, session_id)
        return ERASED_TEXT if aead is None else seal(aead, text, associated(session_id, label, "text"))

    def open_text(self, session_id: str, value: str, label: str) -> str:
        if not value.startswith(PREFIX):
            return value
        aead = self._read_key(session_id)
        if aead is None:
            return ERASED_TEXT
        return open_sealed(
            aead, value, associated(session_id, label, "text"), f"session {session_id} {label}"
        )

    def close(self) -> None:
        self.keys.close()

    def forget(self, session_id: str) -> None:
        """The session is erased: drop its key, and never look it up again in this process."""
        with self._lock:
            self._aeads.pop(session_id, None)
            self._erased[session_id] = None
            if len(self._erased) > CACHE:
                self._erased.popitem(last=False)
        for listener in self._forget_listeners:
            listener(session_id)

    def erased(self, session_id: str) -> bool:
        """Whether this process knows the session is erased (no key store read)."""
        return session_id in self._erased

    def on_forget(self, listener: Callable[[str], None], *, remove: bool = False) -> None:
        """Call ``listener`` with each session this cipher forgets from now on (``remove``:
        stop). It may be called on any thread: it must only note the session."""
        if remove:
            if listener in self._forget_listeners:
                self._forget_listeners.remove(listener)
        else:
            self._forget_listeners.append(listener)

    # -- keys ----------------------------------------------------------------------------------

    def _write_key(self, event: Event | None, session_id: str = "") -> AESGCM | None:
        """The key new content of the session is sealed with, made if the session has none;
        None if the session is erased."""
        sid = event.session_id if event is not None else session_id
        if sid in self._erased:
            return None
        row = self.keys.get(sid)
        if row is None:
            data_key = os.urandom(KEY_BYTES)
            key_id, wrapped = self.master.wrap(sid, data_key)
            row = self.keys.put(DataKey(sid, self._user_of(event), key_id, wrapped, now_ms()))
        return self._remember(row)

    def _read_key(self, session_id: str) -> AESGCM | None:
        cached = self._aeads.get(session_id)
        if cached is not None:
            return cached
        if session_id in self._erased:
            return None
        row = self.keys.get(session_id)
        if row is None:
            raise KeyStoreError(
                f"session {session_id} has encrypted content but no key in {_store_name(self.keys)}: this "
                "process uses another key store than the one that wrote it (TURNLOG_KEYSTORE, the log's "
                "folder), or the key store was lost (restore it from its backup)"
            )
        return self._remember(row)

    def _remember(self, row: DataKey) -> AESGCM | None:
        if row.wrapped is None:
            self.forget(row.session_id)
            return None
        aead = AESGCM(self.master.unwrap(row.session_id, row.master_key_id, row.wrapped))
        with self._lock:
            self._aeads[row.session_id] = aead
            if len(self._aeads) > CACHE:
                self._aeads.popitem(last=False)
        return aead

    def _user_of(self, event: Event | None) -> str:
        if isinstance(event, (SessionCreated, UserMessageReceived)):
            return event.user_id
        if isinstance(event, SessionForked):  # a fork is its origin user's session
            origin = self.keys.get(event.origin_session_id)
            return origin.user_id if origin is not None else ""
        return ""


def is_erased_session(log: object, session_id: str) -> bool:
    """Whether the session's content was erased: its key destroyed in the key store of ``log``'s
    cipher (a log that encrypts nothing has erased nothing)."""
    sealer = getattr(getattr(log, "records", None), "sealer", None)
    if not isinstance(sealer, ContentCipher):
        return False
    key = sealer.keys.get(session_id)
    return key is not None and key.erased


def _where(event: Event, field: str) -> str:
    return f"{event.type} v{event.version} of session {event.session_id}, field {field}"


def _store_name(keys: KeyStore) -> str:
    path = getattr(keys, "path", None) or getattr(keys, "where", None)
    return str(path) if path else "its key store"
