"""API keys: who is calling and with which role.

Keys live in a TOML file, stored as SHA-256 hex digests, never in clear::

    [[keys]]
    user = "alice"
    role = "user"          # "user" or "admin"
    sha256 = "5e884898..."  # `turnlog hash-key KEY` prints it

API keys are long random tokens, so an unsalted fast hash is enough to make a leaked file
useless (the same reasoning as for GitHub tokens); lookups go by digest, so comparing never
depends on how much of a wrong key matched.
"""

from __future__ import annotations

import hashlib
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from turnlog.engine.errors import ConfigurationError

ROLES = ("user", "admin")
"""Known roles, lowest first. An admin may do everything a user may."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: the key's user and role."""

    user: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_open(self, session_role: str) -> bool:
        """A session's role never exceeds the role of the key that opened it."""
        return session_role in ROLES and ROLES.index(session_role) <= ROLES.index(self.role)


def hash_key(key: str) -> str:
    """The SHA-256 of a key, as the key file keeps it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A new random API key (``tlk_`` and 43 URL-safe characters)."""
    return "tlk_" + secrets.token_urlsafe(32)


class KeyStore:
    """Hashed API keys → principals."""

    def __init__(self, entries: Iterable[tuple[str, Principal]]) -> None:
        self._by_digest: dict[str, Principal] = {}
        for digest, principal in entries:
            if principal.role not in ROLES:
                raise ConfigurationError(
                    f"key of user {principal.user!r} has role {principal.role!r}; "
                    f"use one of {', '.join(ROLES)}"
                )
            self._by_digest[digest.lower()] = principal

    @staticmethod
    def from_file(path: str | Path) -> KeyStore:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigurationError(f"no API key file at {path}; create one (see gateway/auth.py)") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"{path} is not valid TOML: {exc}") from None
        entries = []
        for i, row in enumerate(data.get("keys", [])):
            missing = {"user", "role", "sha256"} - set(row)
            if missing:
                raise ConfigurationError(f"{path}: keys[{i}] lacks {', '.join(sorted(missing))}")
            digest = str(row["sha256"])
            if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
                raise ConfigurationError(f"{path}: keys[{i}].sha256 must be 64 hex digits (a SHA-256)")
            entries.append((digest, Principal(str(row["user"]), str(row["role"]))))
        if not entries:
            raise ConfigurationError(f"{path} defines no [[keys]]; the gateway would refuse every request")
        return KeyStore(entries)

    @staticmethod
    def from_plain(keys: dict[str, Principal]) -> KeyStore:
        """For tests and embedding: clear keys are hashed on the way in and not kept."""
        return KeyStore((hash_key(k), p) for k, p in keys.items())

    def authenticate(self, key: str) -> Principal | None:
        return self._by_digest.get(hash_key(key))
