"""Where a deployment's keys are: the embedded log's default (a key store and a master key file
beside the log file), or what ``TURNLOG_KEYSTORE`` names (a PostgreSQL DSN, or a SQLite file)."""

from __future__ import annotations

import os
from pathlib import Path

from .cipher import ContentCipher
from .keystore_sql import SqlKeyStore
from .keystore_sqlite import SqliteKeyStore
from .master import MasterKeys

MASTER_KEY_FILE = "master.key"
KEYSTORE_SCHEMA = "turnlog_keys"
"""The PostgreSQL schema of the key store unless ``TURNLOG_KEYSTORE_SCHEMA`` names another: apart
from the projections, so it can be granted and backed up on its own."""


def keystore_beside(log_path: str | Path) -> Path:
    """The embedded log's key store: ``log.keys.db`` beside ``log.db``."""
    path = Path(log_path)
    return path.with_name(f"{path.stem}.keys.db")


def embedded_cipher(log_path: str | Path, *, durable: bool = False) -> ContentCipher:
    """The embedded log's default: its key store beside it, unless ``TURNLOG_KEYSTORE`` names
    one; the master key from the environment or ``master.key`` beside the log (made on first
    use, mode 0600)."""
    path = Path(log_path)
    store = open_keystore(os.environ.get("TURNLOG_KEYSTORE") or str(keystore_beside(path)), durable=durable)
    return cipher_for(store, MasterKeys.load(path.with_name(MASTER_KEY_FILE)))


def configured_cipher(home: Path | None = None) -> ContentCipher | None:
    """The cipher ``TURNLOG_KEYSTORE`` configures for a distributed deployment (its master key
    from the environment, else ``HOME/master.key``), or None if it names none: such a process
    neither encrypts nor decrypts (docs/architecture.md, "Data lifecycle")."""
    spec = os.environ.get("TURNLOG_KEYSTORE", "").strip()
    if not spec:
        return None
    return cipher_for(
        open_keystore(spec, durable=True), MasterKeys.load(home / MASTER_KEY_FILE if home else None)
    )


def open_keystore(spec: str, *, durable: bool = True) -> SqlKeyStore:
    """A PostgreSQL DSN (``postgresql://...``; schema ``TURNLOG_KEYSTORE_SCHEMA``, default
    ``turnlog_keys``) or a SQLite file path."""
    if spec.startswith(("postgresql://", "postgres://")):
        from .keystore_postgres import PostgresKeyStore  # psycopg only for a deployment that uses it

        return PostgresKeyStore(spec, schema=os.environ.get("TURNLOG_KEYSTORE_SCHEMA") or KEYSTORE_SCHEMA)
    return SqliteKeyStore(spec, durable=durable)


def cipher_for(store: SqlKeyStore, master: MasterKeys) -> ContentCipher:
    return ContentCipher(store, master, recheck_s=store.recheck_s)
