"""Avro codec for events: single-object encoding with fastavro.

Every value on the log is ``C3 01`` + the writer schema's 8-byte CRC-64-AVRO fingerprint
(little endian) + the Avro binary body, the Avro spec's "single object encoding". A reader
looks the fingerprint up to learn which schema wrote the record, so schemas can evolve while
old records stay readable. The Kafka backend also puts the fingerprint in a record header.
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

from .errors import EventEncodeError, MalformedEventError, UnknownSchemaError
from .events import EVENT_TYPES, Event, ToolCallSpec

MAGIC = b"\xc3\x01"
HEADER_LEN = 10
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
ENVELOPE_FIELDS = tuple(f.name for f in dataclasses.fields(Event))
_SHARED = ("Envelope", "ToolCallSpec")


@dataclasses.dataclass(frozen=True, slots=True)
class _Codec:
    cls: type[Event]
    schema: Any
    fingerprint: bytes
    payload_fields: tuple[str, ...]
    numeric_fields: tuple[tuple[str, type], ...]
    """(name, int or float) of every long/double field: fastavro would silently truncate a float
    written to a long and accept a bool as a number, so encode checks these itself."""


def load_schema_json(name: str, schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    path = schema_dir / f"{name}.avsc"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UnknownSchemaError(
            f"no schema file {path}; every event type needs schemas/<Type>.avsc"
        ) from exc


@cache
def _registry() -> tuple[dict[str, _Codec], dict[bytes, _Codec]]:
    named: dict[str, Any] = {}
    for shared in _SHARED:
        parse_schema(load_schema_json(shared), named_schemas=named)
    by_type: dict[str, _Codec] = {}
    by_fp: dict[bytes, _Codec] = {}
    for type_name, cls in EVENT_TYPES.items():
        parsed = parse_schema(load_schema_json(type_name), named_schemas=dict(named))
        fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
        fields = tuple(f.name for f in dataclasses.fields(cls) if f.name not in ENVELOPE_FIELDS)
        codec = _Codec(
            cls, parsed, fp, fields, _numeric_fields(load_schema_json(type_name))
        )  # fastavro gives the little-endian bytes, as on the wire
        by_type[type_name] = codec
        by_fp[codec.fingerprint] = codec
    return by_type, by_fp


_NUMERIC = {"long": int, "int": int, "double": float, "float": float}


def _numeric_fields(schema: dict[str, Any]) -> tuple[tuple[str, type], ...]:
    envelope = load_schema_json("Envelope")["fields"]
    fields = [f for f in schema["fields"] if f["name"] != "envelope"] + envelope
    return tuple(
        (f["name"], _NUMERIC[f["type"]])
        for f in fields
        if isinstance(f["type"], str) and f["type"] in _NUMERIC
    )


def _check_numbers(event: Event, codec: _Codec) -> None:
    for name, kind in codec.numeric_fields:
        value = getattr(event, name)
        ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
        if not ok or isinstance(value, bool):
            raise EventEncodeError(
                f"{event.type} v{event.version} does not fit its schema: field {name} must be "
                f"{'an integer' if kind is int else 'a number'}, got {value!r}"
            )


def schema_fingerprint(event_type: str) -> bytes:
    """The 8-byte fingerprint (as written on the wire) of an event type's current schema."""
    return _registry()[0][event_type].fingerprint


def _to_record(event: Event, codec: _Codec) -> dict[str, Any]:
    record: dict[str, Any] = {name: getattr(event, name) for name in codec.payload_fields}
    record["envelope"] = {name: getattr(event, name) for name in ENVELOPE_FIELDS}
    calls = record.get("tool_calls")
    if calls is not None:
        record["tool_calls"] = [dataclasses.asdict(c) for c in calls]
    return record


def encode(event: Event) -> bytes:
    """Encode an event as an Avro single-object record."""
    codec = _registry()[0].get(event.type)
    if codec is None:
        raise EventEncodeError(f"{type(event).__name__} is not a registered event type")
    _check_numbers(event, codec)
    buf = io.BytesIO()
    buf.write(MAGIC)
    buf.write(codec.fingerprint)
    try:
        fastavro.schemaless_writer(buf, codec.schema, _to_record(event, codec))
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: int beyond Avro long
        raise EventEncodeError(f"{event.type} v{event.version} does not fit its schema: {exc}") from exc
    return buf.getvalue()


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
        record = fastavro.schemaless_reader(body, codec.schema, None)
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
