"""The Avro codec: round trips, the schemas as the contract, the wire format, and bad input."""

from __future__ import annotations

import dataclasses
import io
import json
import typing
from typing import Any

import fastavro
import pytest
from fastavro.schema import parse_schema, to_parsing_canonical_form

from turnlog.engine import codec
from turnlog.engine import events as ev
from turnlog.engine.errors import EventEncodeError, MalformedEventError, UnknownSchemaError
from turnlog.engine.events import EVENT_TYPES, Event, ToolCallSpec
from turnlog.engine.log.sqlite_batch import delimited_events, pack_batch, split_batch
from turnlog.engine.log.zdict import pack

NAMESPACE = "turnlog.events"
ENVELOPE = [f.name for f in dataclasses.fields(Event)]
SPECS = (
    ToolCallSpec("call_1", "lookup_order", '{"order_id": "A-17", "note": "größe"}'),
    ToolCallSpec("call_2", "send_email", "{not json"),  # kept exactly as the model produced it
)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # each class's own module resolves its annotations


def _is(hint: Any, expected: Any) -> bool:
    return bool(hint == expected)


def sample(cls: type[Event], optional: str | None = "set") -> Event:
    """One instance of ``cls`` with a non-default value in every field.

    ``optional`` is the value family for ``str | None`` fields: "set" fills them with text,
    None leaves them None (both must survive a round trip).
    """
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        hint = hints[f.name]
        if _is(hint, str):
            values[f.name] = f"{cls.type}.{f.name} ✓ naïve 日本"
        elif _is(hint, bool):
            values[f.name] = not f.default
        elif _is(hint, int):
            values[f.name] = 2**40 + i  # beyond 32 bits: the schema must say long
        elif _is(hint, float):
            values[f.name] = 1234.5 + i / 8
        elif _is(hint, str | None):
            values[f.name] = None if optional is None else f"{f.name}-value"
        elif _is(hint, tuple[ToolCallSpec, ...]):
            values[f.name] = SPECS
        else:  # pragma: no cover - a new field type needs a case here and in avro_type()
            raise AssertionError(f"{cls.type}.{f.name}: no sample for {hint}")
    return cls(**values)


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_sample_fills_every_field_with_a_non_default(name: str) -> None:
    cls = EVENT_TYPES[name]
    event = sample(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            assert getattr(event, f.name) != f.default, f.name
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(event, f.name) != f.default_factory(), f.name


@pytest.mark.parametrize("optional", ["set", None])
@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_every_event_type_round_trips(name: str, optional: str | None) -> None:
    event = sample(EVENT_TYPES[name], optional)
    decoded = codec.decode(codec.encode(event))
    assert type(decoded) is type(event)
    assert decoded == event


def test_an_appends_body_holds_every_event_behind_its_length() -> None:
    events = [
        sample(EVENT_TYPES[name], optional) for name in sorted(EVENT_TYPES) for optional in ("set", None)
    ]
    body = delimited_events(events)
    assert body == pack_batch([codec.encode(e) for e in events], compress=False)
    assert [codec.decode(r) for r in split_batch(body)] == events
    assert [codec.decode(r) for r in split_batch(pack(delimited_events(events)))] == events


def test_an_append_with_an_event_that_does_not_fit_says_which_and_why() -> None:
    """The writer names the field, or that the class is not a registered event type."""
    ok = sample(ev.StateChanged)
    too_big = dataclasses.replace(sample(ev.ModelCallFinished), input_tokens=2**64)

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Renamed(ev.StateChanged):
        pass

    foreign = Renamed(
        session_id="s", version=1, from_state="IDLE", to_state="PROCESSING", cause="user_message"
    )
    for bad, message in [
        (too_big, "field input_tokens: .* does not fit an Avro long"),
        (foreign, "not a registered"),
    ]:
        with pytest.raises(EventEncodeError, match=message):
            delimited_events([ok, bad])


def test_tool_calls_round_trip_as_a_tuple_of_specs_in_order() -> None:
    event = ev.AssistantMessage(
        session_id="s", version=7, turn_id="t", message_id="m", text="", tool_calls=SPECS
    )
    decoded = codec.decode(codec.encode(event))
    assert isinstance(decoded, ev.AssistantMessage)
    assert decoded.tool_calls == SPECS
    assert isinstance(decoded.tool_calls, tuple)
    assert all(isinstance(c, ToolCallSpec) for c in decoded.tool_calls)


def test_defaults_round_trip() -> None:
    event = ev.AssistantMessage(session_id="s", version=1, turn_id="t", message_id="m", text="hi")
    decoded = codec.decode(codec.encode(event))
    assert decoded == event
    assert decoded.tool_calls == () and decoded.causation_id is None and decoded.producer == "turnlog"


def test_text_that_is_not_valid_unicode_is_an_encode_error_naming_the_field() -> None:
    event = ev.AssistantMessage(session_id="s", version=3, turn_id="t", message_id="m", text="ok \udc00")
    expected = r"AssistantMessage v3 .* field text: .* U\+DC00 at position 3"
    with pytest.raises(EventEncodeError, match=expected):
        codec.encode(event)


def test_largest_avro_long_round_trips() -> None:
    event = ev.SessionClosed(session_id="s", version=2**63 - 1, time_ms=-(2**63), reason="r")
    assert codec.decode(codec.encode(event)) == event


# --- the schemas are the contract ---------------------------------------------------------------


def avro_type(hint: Any) -> Any:
    if _is(hint, str):
        return "string"
    if _is(hint, bool):
        return "boolean"
    if _is(hint, int):
        return "long"
    if _is(hint, float):
        return "double"
    if _is(hint, str | None):
        return ["null", "string"]
    if _is(hint, tuple[ToolCallSpec, ...]):
        return {"type": "array", "items": f"{NAMESPACE}.ToolCallSpec"}
    raise AssertionError(f"no Avro mapping for {hint}")


def qualified(avro: Any) -> Any:
    """Names as written with the namespace, so "ToolCallSpec" and its full name compare equal."""
    if isinstance(avro, dict) and avro.get("type") == "array":
        return {"type": "array", "items": qualified(avro["items"])}
    if isinstance(avro, str) and avro[0].isupper() and "." not in avro:
        return f"{NAMESPACE}.{avro}"
    return avro


def check_fields(cls: type, names: list[str], schema_fields: list[dict[str, Any]]) -> None:
    assert [f["name"] for f in schema_fields] == names
    hints = _hints(cls)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for field in schema_fields:
        name = field["name"]
        assert qualified(field["type"]) == avro_type(hints[name]), f"{cls.__name__}.{name}"
        if "default" in field:  # a reader filling a missing field must get what Python would
            default = defaults[name]
            assert default is not dataclasses.MISSING, f"{cls.__name__}.{name} has no Python default"
            assert (list(default) if isinstance(default, tuple) else default) == field["default"], name


def test_envelope_matches_its_schema_in_order() -> None:
    schema = codec.load_schema_json("Envelope")
    assert schema["name"] == "Envelope" and schema["namespace"] == NAMESPACE
    check_fields(Event, ENVELOPE, schema["fields"])
    assert list(codec.ENVELOPE_FIELDS) == ENVELOPE


def test_tool_call_spec_matches_its_schema() -> None:
    schema = codec.load_schema_json("ToolCallSpec")
    check_fields(ToolCallSpec, [f.name for f in dataclasses.fields(ToolCallSpec)], schema["fields"])


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_event_class_matches_its_schema_field_for_field(name: str) -> None:
    cls = EVENT_TYPES[name]
    schema = codec.load_schema_json(name)
    assert schema["type"] == "record" and schema["name"] == name and schema["namespace"] == NAMESPACE
    first, *payload = schema["fields"]
    assert first["name"] == "envelope" and qualified(first["type"]) == f"{NAMESPACE}.Envelope"
    fields = [f.name for f in dataclasses.fields(cls)]
    assert fields[: len(ENVELOPE)] == ENVELOPE, "the envelope comes first, in order"
    check_fields(cls, fields[len(ENVELOPE) :], payload)


def test_every_schema_file_is_an_event_or_a_shared_record() -> None:
    files = {p.stem for p in codec.SCHEMA_DIR.glob("*.avsc")}
    assert files == set(EVENT_TYPES) | {"Envelope", "ToolCallSpec"}


# --- the wire format ----------------------------------------------------------------------------

EMPTY64 = 0xC15D213AA4D7A795


def crc64_avro(data: bytes) -> int:
    """The Avro spec's Rabin fingerprint, written out independently of fastavro."""
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (EMPTY64 & -(fp & 1))
        table.append(fp)
    fp = EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def canonical_form(name: str) -> str:
    """The canonical form with the envelope and ToolCallSpec written out where first used."""
    named: dict[str, Any] = {}
    for shared in ("Envelope", "ToolCallSpec"):
        parse_schema(codec.load_schema_json(shared), named_schemas=named)
    return to_parsing_canonical_form(
        parse_schema(codec.load_schema_json(name), named_schemas=named, expand=True)
    )


def test_the_fingerprint_covers_the_envelope() -> None:
    assert '"name":"basis_version"' in canonical_form("SessionClosed")


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_wire_format_is_avro_single_object_encoding(name: str) -> None:
    data = codec.encode(sample(EVENT_TYPES[name]))
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.schema_fingerprint(name)
    # the spec: CRC-64-AVRO of the parsing canonical form, little endian
    assert codec.schema_fingerprint(name) == crc64_avro(canonical_form(name).encode()).to_bytes(8, "little")


def test_fingerprints_are_distinct_per_type() -> None:
    prints = {codec.schema_fingerprint(name) for name in EVENT_TYPES}
    assert len(prints) == len(EVENT_TYPES)
    assert all(len(p) == 8 for p in prints)


def test_crc64_reference_vector() -> None:
    # Avro's schema-tests: the CRC-64-AVRO of the canonical form "null" is 7195948357588979594
    assert crc64_avro(b'"null"') == 7195948357588979594
    assert crc64_avro(b'"null"').to_bytes(8, "little").hex() == "8a8f25cce724dd63"  # as on the wire


# --- malformed input ----------------------------------------------------------------------------


def good() -> bytes:
    return codec.encode(ev.SessionClosed(session_id="sess", version=3, reason="done", actor="admin"))


def test_empty_bytes_are_malformed() -> None:
    with pytest.raises(MalformedEventError, match=r"marker c301, got empty \(0 bytes\)"):
        codec.decode(b"")


def test_wrong_marker_is_malformed_and_named() -> None:
    data = b"\x4f\x62" + good()[2:]  # "Ob", as if an Avro container file
    with pytest.raises(MalformedEventError, match="marker c301, got 4f62"):
        codec.decode(data)


def test_json_is_not_an_event() -> None:
    with pytest.raises(MalformedEventError, match="got 7b22"):
        codec.decode(b'{"type": "SessionClosed"}')


def test_shorter_than_the_header_is_malformed() -> None:
    with pytest.raises(MalformedEventError, match=r"\(6 bytes\)"):
        codec.decode(good()[:6])


@pytest.mark.parametrize("cut", [1, 3, 8, 20])
def test_truncated_body_is_malformed(cut: int) -> None:
    data = good()
    with pytest.raises(
        MalformedEventError, match=rf"corrupt SessionClosed record \({len(data) - cut} bytes\)"
    ):
        codec.decode(data[:-cut])


def test_header_without_body_is_malformed() -> None:
    with pytest.raises(MalformedEventError, match="corrupt SessionClosed record"):
        codec.decode(good()[:10])


def test_trailing_garbage_is_malformed() -> None:
    with pytest.raises(MalformedEventError, match="corrupt SessionClosed record: 3 trailing bytes"):
        codec.decode(good() + b"\x00\xff\x01")


def test_invalid_utf8_in_a_string_is_malformed() -> None:
    data = good()
    assert data.count(b"admin") == 1
    with pytest.raises(MalformedEventError, match="UnicodeDecodeError"):
        codec.decode(data.replace(b"admin", b"\xff\xfe\xfd\xfc\xfb"))


def test_unknown_fingerprint_raises_unknown_schema() -> None:
    unknown = bytes.fromhex("0102030405060708")
    assert unknown not in {codec.schema_fingerprint(n) for n in EVENT_TYPES}
    with pytest.raises(UnknownSchemaError, match="unknown schema fingerprint 0102030405060708"):
        codec.decode(b"\xc3\x01" + unknown + good()[10:])


def test_malformed_and_unknown_are_event_errors() -> None:
    from turnlog.engine.errors import EventError

    assert issubclass(MalformedEventError, EventError) and issubclass(UnknownSchemaError, EventError)


# --- encoding refuses what does not fit ---------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "field"),
    [
        (ev.SessionClosed(session_id="s", version=1, reason=123), "reason"),  # type: ignore[arg-type]
        (ev.SessionClosed(session_id="s", version=1, reason=None), "reason"),  # type: ignore[arg-type]
        (
            ev.SessionCreated(session_id="s", version=1, agent_id="a", user_id="u", metadata_json={"a": 1}),
            "metadata_json",
        ),  # type: ignore[arg-type]
        (
            ev.ModelCallStarted(
                session_id="s",
                version=1,
                turn_id="t",
                step="one",
                model="m",  # type: ignore[arg-type]
                message_count=1,
                tools_offered=0,
            ),
            "step",
        ),
        (
            ev.ToolCallFinished(
                session_id="s",
                version=1,
                turn_id="t",
                call_id="c",
                tool_name="x",
                status="success",
                content="ok",
                output_json=42,
            ),
            "output_json",
        ),  # type: ignore[arg-type]
        (
            ev.StateChanged(
                session_id="s",
                version="2",
                from_state="IDLE",
                to_state="PROCESSING",  # type: ignore[arg-type]
                cause="user_message",
            ),
            "version",
        ),
        (
            ev.StateChanged(
                session_id="s",
                version=2,
                from_state="IDLE",
                to_state="PROCESSING",
                cause="user_message",
                causation_id=7,
            ),
            "causation_id",
        ),  # type: ignore[arg-type]
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_wrong_field_type_raises_encode_error_naming_the_field(event: Event, field: str) -> None:
    with pytest.raises(EventEncodeError, match=rf"{event.type} .*does not fit its schema.*{field}"):
        codec.encode(event)


def test_tool_calls_that_are_not_specs_raise_encode_error() -> None:
    event = ev.AssistantMessage(
        session_id="s", version=1, turn_id="t", message_id="m", text="", tool_calls=("lookup",)
    )  # type: ignore[arg-type]
    with pytest.raises(EventEncodeError, match="AssistantMessage v1 does not fit its schema"):
        codec.encode(event)


def test_integer_beyond_avro_long_raises_encode_error() -> None:
    with pytest.raises(EventEncodeError, match="SessionClosed"):
        codec.encode(ev.SessionClosed(session_id="s", version=2**63, reason="r"))


def test_float_in_a_long_field_raises_encode_error() -> None:
    with pytest.raises(EventEncodeError, match="field version: must be an integer, got 1.5"):
        codec.encode(ev.SessionClosed(session_id="s", version=1.5, reason="r"))  # type: ignore[arg-type]


def test_bool_in_a_number_field_raises_encode_error() -> None:
    event = ev.ModelCallFinished(
        session_id="s", version=2, turn_id="t", step=0, model="m", status="ok", latency_ms=True
    )  # type: ignore[arg-type]
    with pytest.raises(EventEncodeError, match="field latency_ms: must be a number"):
        codec.encode(event)


def test_unregistered_event_class_raises_encode_error() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Custom(Event):
        type: typing.ClassVar[str] = "Custom"

    with pytest.raises(EventEncodeError, match="not a registered event type"):
        codec.encode(Custom(session_id="s", version=1))


def _fastavro_bytes(event: Event) -> bytes:
    """The same event written by fastavro itself, from a plain dict."""
    entry = codec._registry()[0][event.type]
    envelope = {name: getattr(event, name) for name in codec.ENVELOPE_FIELDS}
    record: dict[str, Any] = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    record = {k: v for k, v in record.items() if k not in envelope}
    if "tool_calls" in record:
        record["tool_calls"] = [dataclasses.asdict(c) for c in record["tool_calls"]]
    record["envelope"] = envelope
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, entry.schema, record)
    return codec.MAGIC + entry.fingerprint + buf.getvalue()


@pytest.mark.parametrize("optional", ["set", None])
@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_compiled_encoder_writes_exactly_what_fastavro_writes(name: str, optional: str | None) -> None:
    event = sample(EVENT_TYPES[name], optional)
    assert codec.encode(event) == _fastavro_bytes(event)


@pytest.mark.parametrize("version", [1, 63, 64, 127, 128, 8191, 8192, 2**31, 2**62, 2**63 - 1])
@pytest.mark.parametrize("latency", [0.0, -1.5, 1e300, 3])
def test_compiled_encoder_matches_fastavro_on_edge_numbers(version: int, latency: float) -> None:
    event = ev.ModelCallFinished(
        session_id="", version=version, turn_id="t", step=-version, model="", status="ok", latency_ms=latency
    )
    assert codec.encode(event) == _fastavro_bytes(event)
    assert codec.decode(codec.encode(event)) == event


def test_compiled_encoder_matches_fastavro_on_an_empty_tool_call_list() -> None:
    event = ev.AssistantMessage(
        session_id="s", version=4, turn_id="t", message_id="m", text="", tool_calls=()
    )
    assert codec.encode(event) == _fastavro_bytes(event)


def test_a_str_subclass_and_a_list_of_tool_calls_are_written_as_fastavro_writes_them() -> None:

    class Text(str):
        pass

    event = ev.AssistantMessage(
        session_id="s", version=4, turn_id="t", message_id="m", text=Text("hello"),
        tool_calls=(ToolCallSpec("c1", Text("lookup"), "{}"),),
    )  # fmt: skip
    assert codec.encode(event) == _fastavro_bytes(event)
    assert codec.decode(codec.encode(event)).text == "hello"


# -- schema evolution: logs written by older releases stay readable ------------------------------


def test_every_current_schema_is_recorded_in_the_history() -> None:
    recorded = {(event, fp) for event, fp, _ in codec.history_schemas()}
    missing = [t for t in EVENT_TYPES if (t, codec.wire_fingerprint_of(t)) not in recorded]
    assert not missing, (
        f"run `python -m turnlog.engine.schema_history` to record the new schemas of {missing}"
    )


@pytest.mark.parametrize("event_type, fp, canonical", codec.history_schemas())
def test_every_recorded_schema_resolves_into_the_current_one(
    event_type: str, fp: bytes, canonical: str
) -> None:
    """A record written with any released schema decodes into the current event (new fields
    take their defaults), so a schema change that breaks old logs fails here."""
    writer_schema = parse_schema(json.loads(canonical))
    current = sample(EVENT_TYPES[event_type])
    fields = {f["name"]: f for f in writer_schema["fields"]}
    envelope_fields = [f["name"] for f in fields.pop("envelope")["type"]["fields"]]
    envelope = {name: getattr(current, name) for name in envelope_fields}
    payload = {name: _avro_value(getattr(current, name)) for name in fields}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, writer_schema, {"envelope": envelope, **payload})
    decoded = codec.decode(codec.MAGIC + fp + out.getvalue())
    assert type(decoded) is type(current)
    written = {*envelope_fields, *fields}
    for field in dataclasses.fields(current):
        expected = getattr(current, field.name) if field.name in written else field.default
        assert getattr(decoded, field.name) == expected  # fields added since take their defaults


def _avro_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [dataclasses.asdict(item) for item in value]
    return value
