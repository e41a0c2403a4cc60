"""Master key rotation: every live data key rewrapped under the new master key, the log untouched.

With a key file (the embedded default, ``TURNLOG_MASTER_KEY_FILE``) ``rotate_file`` makes a new
key, writes it in front of the old ones (a process that meets a row under the new key reads the
file again), rewraps every row, then leaves only the new key in the file. With keys in the
environment the operator sets the new one in ``TURNLOG_MASTER_KEY`` and the old ones in
``TURNLOG_OLD_MASTER_KEYS``, and ``rewrap`` moves every row to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigurationError
from .keystore_sql import SqlKeyStore
from .master import MasterKeys, new_key_text

BATCH = 500


def rewrap(store: SqlKeyStore, keys: MasterKeys) -> int:
    """Rewrap every live data key not under ``keys.current``; how many."""
    moved = 0
    while rows := store.keys_not_wrapped_by(keys.current.key_id, BATCH):
        batch = []
        for row in rows:
            assert row.wrapped is not None
            data_key = keys.unwrap(row.session_id, row.master_key_id, row.wrapped)
            new_id, wrapped = keys.wrap(row.session_id, data_key)
            batch.append((row.session_id, row.master_key_id, new_id, wrapped))
        store.rewrap(batch)
        moved += len(batch)
    return moved


def rotate_file(store: SqlKeyStore, path: Path) -> tuple[str, int]:
    """A new master key in the key file at ``path``, every data key rewrapped under it, the old
    keys dropped from the file; (the new key id, keys rewrapped)."""
    if not path.exists():
        raise ConfigurationError(f"no master key file at {path}")
    old = path.read_text()
    _replace(path, new_key_text() + "\n" + old)  # the new key first, the old ones still there
    keys = MasterKeys.from_file(path, create=False)
    moved = rewrap(store, keys)
    _replace(path, path.read_text().splitlines()[0] + "\n")
    return keys.current.key_id, moved


def _replace(path: Path, text: str) -> None:
    """Write the key file whole or not at all, readable by its owner only."""
    tmp = path.with_name(path.name + f".{os.getpid()}.rotating")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
