"""How a persisting log encodes events: the Avro codec, with the engine's content encryption
around it when the log was given a ``Sealer`` (engine.crypto.ContentCipher).

The log decides nothing about what a field means: it hands each event to its sealer before it
encodes it and after it decodes it, asks it before a read (``reading``: keys other processes
destroyed), and, where it keeps decoded events in memory (the Kafka index), asks whether an
event erases its session and what the session's events read as then (``erases``, ``scrub``).
The in-memory log has none: it keeps objects, nothing is encoded.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from .. import codec
from ..errors import EventError
from ..events import Event


class Sealer(Protocol):
    def seal(self, event: Event) -> Event:
        """``event`` as the log may store it (content encrypted)."""
        ...

    def open(self, event: Event) -> Event:
        """A decoded event as its readers see it (content decrypted, or erased)."""
        ...

    def reading(self) -> None:
        """Called before a read decodes records."""
        ...

    def erases(self, event: Event) -> bool:
        """Whether ``event`` erases its session's content."""
        ...

    def scrub(self, event: Event) -> Event:
        """An event of an erased session as it reads once its key is gone."""
        ...

    def erased(self, session_id: str) -> bool:
        """Whether this process knows the session is erased."""
        ...

    def on_forget(self, listener: Callable[[str], None], *, remove: bool = False) -> None:
        """Call ``listener`` with each session found erased from now on (on any thread)."""
        ...

    def seal_text(self, session_id: str, text: str, label: str) -> str: ...

    def open_text(self, session_id: str, value: str, label: str) -> str: ...

    def close(self) -> None:
        """Release what it holds (its key store), when the log that made it closes."""
        ...


class RecordCodec:
    """Encodes and decodes a log's records, through its sealer if it has one."""

    def __init__(self, sealer: Sealer | None = None) -> None:
        self.sealer = sealer

    def encode(self, event: Event) -> bytes:
        sealer = self.sealer
        return codec.encode(event if sealer is None else sealer.seal(event))

    def encode_all(self, events: Sequence[Event]) -> list[bytes]:
        sealer = self.sealer
        if sealer is None:
            return [codec.encode(e) for e in events]
        return [codec.encode(sealer.seal(e)) for e in events]

    def decode(self, data: bytes) -> Event:
        """``codec.decode`` and the sealer's ``open``; EventError as ``codec.decode`` raises."""
        event = codec.decode(data)
        sealer = self.sealer
        return event if sealer is None else sealer.open(event)

    def decode_at(self, partition: int, position: int, record: bytes) -> Event:
        try:
            return self.decode(record)
        except EventError as exc:
            raise type(exc)(f"partition {partition} offset {position}: {exc}") from exc

    def reading(self) -> None:
        if self.sealer is not None:
            self.sealer.reading()

    def erases(self, event: Event) -> bool:
        return self.sealer is not None and self.sealer.erases(event)

    def scrub(self, event: Event) -> Event:
        return event if self.sealer is None else self.sealer.scrub(event)

    def erased(self, session_id: str) -> bool:
        return self.sealer is not None and self.sealer.erased(session_id)

    def on_forget(self, listener: Callable[[str], None], *, remove: bool = False) -> None:
        if self.sealer is not None:
            self.sealer.on_forget(listener, remove=remove)

    def seal_text(self, session_id: str, text: str, label: str) -> str:
        return text if self.sealer is None else self.sealer.seal_text(session_id, text, label)

    def open_text(self, session_id: str, value: str, label: str) -> str:
        return value if self.sealer is None else self.sealer.open_text(session_id, value, label)


PLAIN = RecordCodec()
"""No encryption: what a log without a sealer (and a reader of raw records) uses."""
