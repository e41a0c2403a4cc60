"""Avro codec for events: single-object encoding with fastavro.

Every value on the log is ``C3 01`` + the writer schema's 8-byte CRC-64-AVRO fingerprint
(little endian) + the Avro binary body, the Avro spec's "single object encoding". A reader
looks the fingerprint up to learn which schema wrote the record, so schemas can evolve while
old records stay readable. The Kafka backend also puts the fingerprint in a record header.

Schema history: ``schemas/history/Envelope.N.avsc`` keeps every earlier envelope. Each event
type is registered under its fingerprint with each of them too, and such records are read with
Avro schema resolution into the current classes (new envelope fields take their defaults).
Envelope.1 is the envelope before ``basis_version``.
"""

from __future__ import annotations

import dataclasses
import io
import json
from functools import cache
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from .avro import Writer, compile_writer
from .errors import EventEncodeError, MalformedEventError, UnknownSchemaError
from .events import EVENT_TYPES, Event, ToolCallSpec

MAGIC = b"\xc3\x01"
HEADER_LEN = 10
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
HISTORY_DIR = SCHEMA_DIR / "history"
LEGACY_ENVELOPE = "Envelope.1.avsc"
"""Records written with it carry the legacy fingerprint (named records not written out)."""
ENVELOPE_FIELDS = tuple(f.name for f in dataclasses.fields(Event))
_INLINE = frozenset({"turnlog.events.Envelope"})
"""The envelope's fields are attributes of the event itself, not of a nested object."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Codec:
    cls: type[Event]
    schema: Any
    """fastavro's parsed schema, for reading."""
    fingerprint: bytes
    writer: Writer
    """The compiled encoder (engine.avro), for writing."""
    reader: Any = None
    """For a record written with an older envelope: the current schema to resolve it into."""


def load_schema_json(name: str, schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    path = schema_dir / f"{name}.avsc"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UnknownSchemaError(
            f"no schema file {path}; every event type needs schemas/<Type>.avsc"
        ) from exc


def _fingerprint(raw: dict[str, Any], named: dict[str, Any], *, expand: bool = True) -> tuple[Any, bytes]:
    """The parsed schema and its 8-byte wire fingerprint (fastavro gives it little endian).

    The fingerprint is taken over the schema with its named records (the envelope,
    ToolCallSpec) written out, so changing the envelope changes every event's fingerprint.
    ``expand=False`` is the legacy fingerprint, over the name only (records written before
    ``basis_version``).
    """
    parsed = parse_schema(raw, named_schemas=dict(named))
    canonical = parse_schema(raw, named_schemas=dict(named), expand=True) if expand else parsed
    return parsed, bytes.fromhex(fingerprint(to_parsing_canonical_form(canonical), "CRC-64-AVRO"))


def _shared(envelope: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parsed and raw named schemas (envelope, ToolCallSpec) for one envelope version."""
    named: dict[str, Any] = {}
    named_json: dict[str, Any] = {}
    for raw in (envelope, load_schema_json("ToolCallSpec")):
        parse_schema(raw, named_schemas=named)
        named_json[f"{raw['namespace']}.{raw['name']}"] = raw
    return named, named_json


@cache
def _registry() -> tuple[dict[str, _Codec], dict[bytes, _Codec]]:
    named, named_json = _shared(load_schema_json("Envelope"))
    by_type: dict[str, _Codec] = {}
    by_fp: dict[bytes, _Codec] = {}
    for type_name, cls in EVENT_TYPES.items():
        raw = load_schema_json(type_name)
        parsed, fp = _fingerprint(raw, named)
        writer = compile_writer(raw, dict(named_json), inline_records=_INLINE)
        codec = _Codec(cls, parsed, fp, writer)
        by_type[type_name] = codec
        by_fp[codec.fingerprint] = codec
    for old in sorted(HISTORY_DIR.glob("Envelope.*.avsc")):
        old_named, _ = _shared(json.loads(old.read_text(encoding="utf-8")))
        for type_name, current in by_type.items():
            raw = load_schema_json(type_name)
            fps = [_fingerprint(raw, old_named)]
            if old.name == LEGACY_ENVELOPE:
                fps.append(_fingerprint(raw, old_named, expand=False))
            for parsed, fp in fps:
                resolved = dataclasses.replace(current, schema=parsed, fingerprint=fp, reader=current.schema)
                by_fp.setdefault(fp, resolved)
    return by_type, by_fp


def schema_fingerprint(event_type: str) -> bytes:
    """The 8-byte fingerprint (as written on the wire) of an event type's current schema."""
    return _registry()[0][event_type].fingerprint


def encode(event: Event) -> bytes:
    """Encode an event as an Avro single-object record."""
    codec = _registry()[0].get(event.type)
    if codec is None or type(event) is not codec.cls:
        raise EventEncodeError(f"{type(event).__name__} is not a registered event type")
    out = bytearray(MAGIC)
    out += codec.fingerprint
    try:
        codec.writer(out, event)
    except (TypeError, OverflowError) as exc:
        raise EventEncodeError(f"{event.type} v{event.version} does not fit its schema: {exc}") from exc
    return bytes(out)


def decode(data: bytes) -> Event:
    """Decode one record; raises MalformedEventError / UnknownSchemaError naming the problem."""
    if len(data) < HEADER_LEN or data[:2] != MAGIC:
        head = data[:2].hex() or "empty"
        raise MalformedEventError(
            f"not a turnlog event: expected the Avro single-object marker c301, got {head} "
            f"({len(data)} bytes)"
        )
    fp = bytes(data[2:HEADER_LEN])
    codec = _registry()[1].get(fp)
    if codec is None:
        raise UnknownSchemaError(
            f"record written with unknown schema fingerprint {fp.hex()}; it comes from a newer "
            "or foreign producer. Upgrade turnlog or add the writer schema to schemas/."
        )
    body = io.BytesIO(memoryview(data)[HEADER_LEN:])
    try:
        record = fastavro.schemaless_reader(body, codec.schema, codec.reader)
    except Exception as exc:  # fastavro raises EOFError, UnicodeDecodeError, IndexError...
        raise MalformedEventError(
            f"corrupt {codec.cls.type} record ({len(data)} bytes): {type(exc).__name__}: {exc}"
        ) from exc
    if body.tell() != len(data) - HEADER_LEN:
        raise MalformedEventError(
            f"corrupt {codec.cls.type} record: {len(data) - HEADER_LEN - body.tell()} trailing bytes"
        )
    return _from_record(record, codec)  # type: ignore[arg-type]


def _from_record(record: dict[str, Any], codec: _Codec) -> Event:
    fields = record.pop("envelope")
    fields.update(record)
    calls = fields.get("tool_calls")
    if calls is not None:
        fields["tool_calls"] = tuple(ToolCallSpec(**c) for c in calls)
    return codec.cls(**fields)
