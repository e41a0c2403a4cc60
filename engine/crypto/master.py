"""The master key: what wraps every session's data key (envelope encryption).

A data key is stored wrapped (AES-256-GCM under the master key, bound to its session id), with
the id of the master key that wrapped it, so the master key can be rotated by rewrapping the
data keys (``rotation.rotate``) without touching the log. Where it comes from, first found:

* ``TURNLOG_MASTER_KEY``: the key itself, base64 of 32 bytes (``TURNLOG_OLD_MASTER_KEYS``:
  earlier ones, comma-separated, while a rotation is under way);
* ``TURNLOG_MASTER_KEY_FILE``: a file holding it, one key a line, the current one first;
* the default file the deployment names (the embedded log's: ``master.key`` beside it), made
  on first use with mode 0600 (the path is said once, on stderr).

A key file that another process rotated is read again when a row names a key it lacks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import ConfigurationError, KeyStoreError

KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class MasterKey:
    key_id: str
    """The first 16 hex digits of the key's SHA-256: rows name the key that wrapped them."""
    aead: AESGCM

    @staticmethod
    def from_bytes(raw: bytes) -> MasterKey:
        if len(raw) != KEY_BYTES:
            raise ConfigurationError(
                f"a master key is {KEY_BYTES} bytes (base64: 44 characters), not {len(raw)}"
            )
        return MasterKey(hashlib.sha256(raw).hexdigest()[:16], AESGCM(raw))


def new_key_text() -> str:
    """A fresh master key as a key file line (base64)."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def _parse(text: str, where: str) -> MasterKey:
    try:
        return MasterKey.from_bytes(base64.b64decode(text.strip(), validate=True))
    except (binascii.Error, ConfigurationError) as exc:
        raise ConfigurationError(
            f"{where} does not hold a master key ({exc}); a key is base64 of 32 random bytes, "
            'as `python -c "import os,base64;print(base64.b64encode(os.urandom(32)).decode())"` prints'
        ) from exc


class MasterKeys:
    """The master keys a process knows: the current one (wraps new data keys) and older ones
    (unwrap rows not rewrapped yet)."""

    def __init__(self, current: MasterKey, older: tuple[MasterKey, ...] = (), *, file: Path | None = None):
        self.current = current
        self._by_id = {k.key_id: k for k in (current, *older)}
        self.file = file
        """The key file they came from (read again for a key id it lacked), or None."""
        self._lock = threading.Lock()

    @staticmethod
    def load(default_file: Path | None = None) -> MasterKeys:
        """The keys as the environment or ``default_file`` give them (module docstring)."""
        env = os.environ
        if text := env.get("TURNLOG_MASTER_KEY", "").strip():
            older = [t for t in env.get("TURNLOG_OLD_MASTER_KEYS", "").split(",") if t.strip()]
            return MasterKeys(
                _parse(text, "TURNLOG_MASTER_KEY"),
                tuple(_parse(t, "TURNLOG_OLD_MASTER_KEYS") for t in older),
            )
        if path := env.get("TURNLOG_MASTER_KEY_FILE", "").strip():
            return MasterKeys.from_file(Path(path), create=False)
        if default_file is None:
            raise ConfigurationError(
                "no master key: set TURNLOG_MASTER_KEY (base64 of 32 random bytes) or "
                "TURNLOG_MASTER_KEY_FILE (a file holding one), the same in every process of the deployment"
            )
        return MasterKeys.from_file(default_file, create=True)

    @staticmethod
    def from_file(path: Path, *, create: bool) -> MasterKeys:
        if not path.exists():
            if not create:
                raise ConfigurationError(f"the master key file {path} does not exist")
            _create(path)
        lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        if not lines:
            raise ConfigurationError(f"the master key file {path} holds no key")
        keys = [_parse(line, str(path)) for line in lines]
        return MasterKeys(keys[0], tuple(keys[1:]), file=path)

    def get(self, key_id: str) -> MasterKey:
        """The master key of ``key_id``; KeyStoreError naming what to do if unknown."""
        with self._lock:
            found = self._by_id.get(key_id)
            if found is None and self.file is not None and self.file.exists():
                fresh = MasterKeys.from_file(self.file, create=False)  # rotated by another process?
                self.current, self._by_id = fresh.current, {**self._by_id, **fresh._by_id}
                found = self._by_id.get(key_id)
        if found is None:
            raise KeyStoreError(
                f"a data key was wrapped by master key {key_id}, which this process does not have "
                "(it has " + ", ".join(sorted(self._by_id)) + "): give every process the same master key "
                "(TURNLOG_MASTER_KEY or TURNLOG_MASTER_KEY_FILE), and during a rotation the old one too"
            )
        return found

    def wrap(self, session_id: str, data_key: bytes) -> tuple[str, bytes]:
        """``data_key`` wrapped by the current master key: (its key id, nonce + ciphertext)."""
        nonce = os.urandom(12)
        current = self.current
        return current.key_id, nonce + current.aead.encrypt(nonce, data_key, _bound(session_id))

    def unwrap(self, session_id: str, key_id: str, wrapped: bytes) -> bytes:
        try:
            return self.get(key_id).aead.decrypt(wrapped[:12], wrapped[12:], _bound(session_id))
        except InvalidTag as exc:
            raise KeyStoreError(
                f"the data key of session {session_id} does not unwrap with master key {key_id}: "
                "the key store row is damaged, or belongs to another session"
            ) from exc


def _bound(session_id: str) -> bytes:
    return b"turnlog data key\x1f" + session_id.encode()


def _create(path: Path) -> None:
    """A new key file, readable by its owner only, written so a half-made file never exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(new_key_text() + "\n")
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(tmp, path)  # fails if another process made it first: theirs stays
    except FileExistsError:
        pass
    else:  # said on stderr, once, whatever the logging setup: like ssh-keygen's, it must be seen
        print(
            f"turnlog: made a master key at {path} (mode 0600); back it up apart from the log and "
            "its key store: without it the content cannot be read",
            file=sys.stderr,
        )
    finally:
        tmp.unlink(missing_ok=True)
