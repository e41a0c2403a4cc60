"""The compiled decoder (engine.avro_read) against fastavro: same events from the same bytes,
for every schema in schemas/ and every schema in its history, and the same refusals."""

from __future__ import annotations

import dataclasses
import io
import json
import random
from typing import Any

import fastavro
import pytest
from fastavro.schema import parse_schema

from tests.test_codec import sample
from turnlog.engine import codec
from turnlog.engine import events as ev
from turnlog.engine.avro_read import Unsupported, compile_reader
from turnlog.engine.errors import MalformedEventError
from turnlog.engine.events import EVENT_TYPES, Event, ToolCallSpec

HISTORY = codec.history_schemas()


def _random_event(cls: type[Event], rng: random.Random) -> Event:
    """An event with random values of every kind the schemas hold (long strings, multi-byte
    text, negative and 64-bit numbers, None, empty and long tool call lists)."""
    values: dict[str, Any] = {}
    proto = sample(cls)
    for f in dataclasses.fields(cls):
        kind = type(getattr(proto, f.name))
        if kind is str:
            values[f.name] = _text(rng)
        elif kind is bool:
            values[f.name] = rng.random() < 0.5
        elif kind is int:
            values[f.name] = rng.choice([0, 1, -1, 63, 64, -65, 8191, 8192, 2**40, -(2**63), 2**63 - 1])
        elif kind is float:
            values[f.name] = rng.choice([0.0, -1.5, 1e300, rng.random() * 1e6])
        elif kind is tuple:
            values[f.name] = tuple(
                ToolCallSpec(_text(rng), _text(rng), _text(rng)) for _ in range(rng.choice([0, 1, 3, 70]))
            )
        else:  # str | None came out as str in the sample
            raise AssertionError(f"{cls.type}.{f.name}: no random value for {kind}")
    for f in dataclasses.fields(cls):  # optional strings: None half of the time
        if f.default is None and rng.random() < 0.5:
            values[f.name] = None
    return cls(**values)


def _text(rng: random.Random) -> str:
    n = rng.choice([0, 1, 31, 63, 64, 200, 9000])
    return "".join(rng.choices('aZ9 {}"\\é日本🙂', k=n))


def _by_fastavro(data: bytes) -> Event:
    return codec.decode_fastavro(data)


def _compiled(data: bytes) -> Event:
    read = codec._reader(codec._registry()[1][data[2:10]])
    assert read is not None, "every schema we have must compile"
    return read(data, codec.HEADER_LEN)


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_compiled_decoder_reads_what_fastavro_reads_for_every_current_schema(name: str) -> None:
    rng = random.Random(name)
    events = [sample(EVENT_TYPES[name], "set"), sample(EVENT_TYPES[name], None)]
    events += [_random_event(EVENT_TYPES[name], rng) for _ in range(40)]
    for event in events:
        data = codec.encode(event)
        decoded = _compiled(data)
        assert decoded == _by_fastavro(data) == event
        assert codec.encode(decoded) == data  # byte for byte


def _old_record(event_type: str, canonical: str, rng: random.Random) -> bytes:
    """A record written with an older schema, by fastavro from a dict."""
    writer_schema = parse_schema(json.loads(canonical))
    current = _random_event(EVENT_TYPES[event_type], rng)
    fields = {f["name"]: f for f in writer_schema["fields"]}
    envelope_fields = [f["name"] for f in fields.pop("envelope")["type"]["fields"]]
    envelope = {name: getattr(current, name) for name in envelope_fields}
    payload: dict[str, Any] = {}
    for name in fields:
        value = getattr(current, name)
        payload[name] = [dataclasses.asdict(c) for c in value] if isinstance(value, tuple) else value
    out = io.BytesIO()
    fastavro.schemaless_writer(out, writer_schema, {"envelope": envelope, **payload})
    return out.getvalue()


@pytest.mark.parametrize(
    ("event_type", "fp", "canonical"), HISTORY, ids=[f"{t}-{fp.hex()}" for t, fp, _ in HISTORY]
)
def test_compiled_decoder_resolves_every_recorded_schema_as_fastavro_does(
    event_type: str, fp: bytes, canonical: str
) -> None:
    rng = random.Random(fp)
    for _ in range(30):
        data = codec.MAGIC + fp + _old_record(event_type, canonical, rng)
        assert _compiled(data) == _by_fastavro(data)


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_a_truncated_record_is_refused_by_both_decoders(name: str) -> None:
    data = codec.encode(sample(EVENT_TYPES[name]))
    for cut in range(codec.HEADER_LEN, len(data)):
        with pytest.raises(MalformedEventError, match=f"corrupt {name} record"):
            codec.decode(data[:cut])
        with pytest.raises(MalformedEventError):
            _by_fastavro(data[:cut])


def test_a_flipped_byte_reads_as_fastavro_reads_it_or_is_refused_by_both() -> None:
    rng = random.Random(7)
    event = sample(ev.AssistantMessage)
    data = codec.encode(event)
    for _ in range(2000):
        i = rng.randrange(codec.HEADER_LEN, len(data))
        bad = data[:i] + bytes([rng.randrange(256)]) + data[i + 1 :]
        try:
            expected: Event | None = _by_fastavro(bad)
        except MalformedEventError:
            expected = None
        if expected is None:
            with pytest.raises(MalformedEventError):
                codec.decode(bad)
        else:
            try:
                assert codec.decode(bad) == expected
            except MalformedEventError:
                # fastavro accepts a few things the spec refuses (a boolean byte above 1,
                # a negative length); the compiled decoder refuses them
                pass


def test_a_schema_the_compiler_does_not_handle_is_left_to_fastavro() -> None:
    schema = {
        "type": "record",
        "name": "M",
        "fields": [{"name": "m", "type": {"type": "map", "values": "long"}}],
    }
    with pytest.raises(Unsupported):
        compile_reader(schema, schema, dict, classes={})


def test_a_field_added_without_a_default_cannot_be_resolved() -> None:
    writer = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    reader = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "long"}],
    }
    with pytest.raises(Unsupported, match="field b has no default"):
        compile_reader(writer, reader, dict, classes={})


def test_a_field_the_reader_dropped_is_read_and_skipped() -> None:
    writer = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "gone", "type": ["null", "string"]}, {"name": "a", "type": "long"}],
    }
    reader = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    read = compile_reader(writer, reader, dict, classes={})
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parse_schema(writer), {"gone": "x" * 100, "a": -5})
    assert read(out.getvalue(), 0) == {"a": -5}
