"""Avro codec for events: single-object encoding, compiled both ways (fastavro is the reference).

Every value on the log is ``C3 01`` + the writer schema's 8-byte CRC-64-AVRO fingerprint
(little endian) + the Avro binary body, the Avro spec's "single object encoding". A reader
looks the fingerprint up to learn which schema wrote the record, so schemas can evolve while
old records stay readable. The Kafka backend also puts the fingerprint in a record header.

Schema history: ``schemas/history/`` keeps every schema a release wrote events with, in
canonical form under its wire fingerprint (``python -m turnlog.engine.schema_history`` records new
ones; a test fails until it is run). Such records are read with Avro schema resolution into the
current classes: fields added since take their defaults.

Both directions are compiled per schema (engine.avro for writing, engine.avro_read for
reading, each decoder made on the first record of its fingerprint); fastavro parses the
schemas, computes the fingerprints, and reads any schema the decoder compiler does not handle.
"""

from __future__ import annotations

import dataclasses
import io
import json
from functools import cache
from pathlib import Path
from typing import Any, Callable, Sequence

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from .avro import (
    Program,
    Writer,
    compile_program,
    compile_writer,
    register_native,
    write_delimited,
    write_native,
)
from .avro_read import Unsupported, compile_reader
from .errors import EventEncodeError, MalformedEventError, UnknownSchemaError
from .events import EVENT_TYPES, Event, ToolCallSpec

MAGIC = b"\xc3\x01"
HEADER_LEN = 10
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
HISTORY_DIR = SCHEMA_DIR / "history"
"""Every schema events were ever written with, so logs written by older releases stay readable."""
ENVELOPE_FIELDS = tuple(f.name for f in dataclasses.fields(Event))
_INLINE = frozenset({"turnlog.events.Envelope"})
"""The envelope's fields are attributes of the event itself, not of a nested object."""
_CLASSES: dict[str, type] = {"turnlog.events.ToolCallSpec": ToolCallSpec}
"""Nested records the compiled decoder builds objects of."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Codec:
    cls: type[Event]
    schema: Any
    """fastavro's parsed schema, for reading."""
    fingerprint: bytes
    writer: Writer
    """The compiled encoder (engine.avro), for writing."""
    program: Program | None = None
    """The native writer's program for this type (None without it): tried first."""
    writer_schema: Any = None
    """For a record an older schema wrote: that schema, resolved into ``schema`` when read."""
    reader_json: Any = None
    """The current schema, named records written out (what the compiled decoder reads into)."""
    writer_json: Any = None
    """``writer_schema`` as JSON (what the compiled decoder reads from)."""
    header: bytes = b""
    """What every record of this schema starts with: the marker and the fingerprint (set from
    them)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "header", MAGIC + self.fingerprint)


def load_schema_json(name: str, schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    path = schema_dir / f"{name}.avsc"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UnknownSchemaError(
            f"no schema file {path}; every event type needs schemas/<Type>.avsc"
        ) from exc


def _fingerprint(raw: dict[str, Any], named: dict[str, Any]) -> tuple[Any, bytes]:
    """The parsed schema and its 8-byte wire fingerprint (fastavro gives it little endian).

    The fingerprint is taken over the schema with its named records (the envelope,
    ToolCallSpec) written out, so changing the envelope changes every event's fingerprint.
    (Releases before ``basis_version`` took it over the names only; their schemas are in
    ``schemas/history/`` under the fingerprints they wrote.)
    """
    parsed = parse_schema(raw, named_schemas=dict(named))
    expanded = parse_schema(raw, named_schemas=dict(named), expand=True)
    return parsed, bytes.fromhex(fingerprint(to_parsing_canonical_form(expanded), "CRC-64-AVRO"))


def _shared(envelope: dict[str, Any], schema_dir: Path = SCHEMA_DIR) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parsed and raw named schemas (envelope, ToolCallSpec) for one envelope version."""
    named: dict[str, Any] = {}
    named_json: dict[str, Any] = {}
    for raw in (envelope, load_schema_json("ToolCallSpec", schema_dir)):
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
        program = compile_program(raw, dict(named_json), inline_records=_INLINE, cls=cls)
        reader = expand_schema(raw, named_json)
        codec = _Codec(cls, parsed, fp, writer, program, reader_json=reader)
        if program is not None:
            register_native(cls, codec.header, program)
        by_type[type_name] = codec
        by_fp[codec.fingerprint] = codec
    for type_name, fp, canonical in history_schemas():
        current = by_type.get(type_name)
        if current is not None and fp not in by_fp:
            old = json.loads(canonical)
            by_fp[fp] = dataclasses.replace(
                current, fingerprint=fp, writer_schema=parse_schema(old), writer_json=old
            )
    return by_type, by_fp


def expand_schema(raw: Any, named_json: dict[str, Any]) -> Any:
    """``raw`` with references to the shared named records (envelope, ToolCallSpec) written out."""
    if isinstance(raw, str):
        target = named_json.get(raw)
        return raw if target is None else expand_schema(target, named_json)
    if isinstance(raw, list):
        return [expand_schema(branch, named_json) for branch in raw]
    if isinstance(raw, dict):
        out = dict(raw)
        if "fields" in raw:
            out["fields"] = [{**f, "type": expand_schema(f["type"], named_json)} for f in raw["fields"]]
        if "items" in raw:
            out["items"] = expand_schema(raw["items"], named_json)
        return out
    return raw


_READERS: dict[bytes, Callable[[bytes, int], Event] | None] = {}
"""Compiled decoders by wire fingerprint, each made on its first record; None: fastavro reads."""


def _reader(codec: _Codec) -> Callable[[bytes, int], Event] | None:
    """The compiled decoder for records written with ``codec.fingerprint``."""
    try:
        return _READERS[codec.fingerprint]
    except KeyError:
        pass
    writer = codec.writer_json if codec.writer_json is not None else codec.reader_json
    try:
        read = compile_reader(writer, codec.reader_json, codec.cls, classes=_CLASSES, inline=_INLINE)
    except Unsupported:
        read = None
    _READERS[codec.fingerprint] = read
    return read


def wire_fingerprint_of(type_name: str, schema_dir: Path = SCHEMA_DIR) -> bytes:
    """The wire fingerprint of an event type's schema as found in ``schema_dir``."""
    named, _ = _shared(load_schema_json("Envelope", schema_dir), schema_dir)
    return _fingerprint(load_schema_json(type_name, schema_dir), named)[1]


def canonical_schema(type_name: str, schema_dir: Path = SCHEMA_DIR) -> str:
    """An event type's schema in Avro parsing canonical form, self-contained (named records
    written out), as the history keeps it."""
    named, _ = _shared(load_schema_json("Envelope", schema_dir), schema_dir)
    raw = load_schema_json(type_name, schema_dir)
    return to_parsing_canonical_form(parse_schema(raw, named_schemas=named, expand=True))


def history_schemas(history_dir: Path = HISTORY_DIR) -> list[tuple[str, bytes, str]]:
    """(event type, wire fingerprint, self-contained canonical schema) of every schema a released
    turnlog wrote events with."""
    entries = []
    for path in sorted(history_dir.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        schema = json.dumps(data["schema"], separators=(",", ":"))
        entries.append((str(data["event"]), bytes.fromhex(data["fingerprint"]), schema))
    return entries


def schema_fingerprint(event_type: str) -> bytes:
    """The 8-byte fingerprint (as written on the wire) of an event type's current schema."""
    return _registry()[0][event_type].fingerprint


def encode(event: Event) -> bytes:
    """Encode an event as an Avro single-object record."""
    codec = _registry()[0].get(event.type)
    if codec is None or type(event) is not codec.cls:
        raise EventEncodeError(f"{type(event).__name__} is not a registered event type")
    if codec.program is not None:
        try:
            return write_native(codec.header, event, codec.program)
        except Exception:  # noqa: S110 - the Python writer writes the value or says what is wrong
            pass
    out = bytearray(codec.header)
    try:
        codec.writer(out, event)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EventEncodeError(f"{event.type} v{event.version} does not fit its schema: {exc}") from exc
    return bytes(out)


def encode_delimited(events: Sequence[Event]) -> bytes | None:
    """The events' records, each behind its length as an unsigned varint (the embedded log's
    batch body, engine.log.sqlite_batch), in one native call: per event, that saves the
    Python calls of ``encode``, whose code is cold in the CPU caches by the next append. None
    without the native writer or when it refuses an event: ``encode`` them one by one (which
    names what is wrong)."""
    _registry()  # registers the native programs on first use
    return write_delimited(events)


def type_of(record: bytes) -> str | None:
    """The event type a record's header names, without decoding it; None if the header is not
    a turnlog event's or names a schema this turnlog does not know (``decode`` says which)."""
    if len(record) < HEADER_LEN or record[:2] != MAGIC:
        return None
    codec = _registry()[1].get(bytes(record[2:HEADER_LEN]))
    return None if codec is None else codec.cls.type


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
    read = _READERS.get(fp) or _reader(codec)
    if read is not None:
        if type(data) is not bytes:
            data = bytes(data)  # the generated code slices and decodes bytes
        try:
            return read(data, HEADER_LEN)
        except Exception as exc:  # IndexError (ran out of bytes), UnicodeDecodeError, ValueError...
            raise _corrupt(codec, data, exc) from exc
    return _decode_fastavro(data, codec)


def decode_fastavro(data: bytes) -> Event:
    """``decode`` through fastavro only (the reference the compiled decoder is tested against)."""
    codec = _registry()[1][bytes(data[2:HEADER_LEN])]
    return _decode_fastavro(data, codec)


def _corrupt(codec: _Codec, data: bytes, exc: Exception) -> MalformedEventError:
    if isinstance(exc, ValueError) and str(exc).endswith("trailing bytes"):
        return MalformedEventError(f"corrupt {codec.cls.type} record: {exc}")
    if isinstance(exc, IndexError):
        exc = EOFError("the record ends inside a value")
    return MalformedEventError(
        f"corrupt {codec.cls.type} record ({len(data)} bytes): {type(exc).__name__}: {exc}"
    )


def _decode_fastavro(data: bytes, codec: _Codec) -> Event:
    body = io.BytesIO(memoryview(data)[HEADER_LEN:])
    try:
        if codec.writer_schema is None:
            record = fastavro.schemaless_reader(body, codec.schema, None)
        else:  # an older writer: Avro schema resolution fills the fields it lacked with their defaults
            record = fastavro.schemaless_reader(body, codec.writer_schema, codec.schema)
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
