"""The compiled encoder (engine.avro) on its own: fastavro's bytes for schemas beyond the event
types (nested and optional records, arrays of arrays, every primitive, multi-byte lengths), and
refusals that name the field, nested fields included."""

from __future__ import annotations

import dataclasses
import io
import random
import sys
import types
from typing import Any

import fastavro
import pytest
from fastavro.schema import parse_schema

from turnlog.engine import avro, codec
from turnlog.engine import events as ev
from turnlog.engine.avro import compile_writer
from turnlog.engine.errors import EventEncodeError
from turnlog.engine.events import ToolCallSpec

POINT = {
    "type": "record",
    "name": "Point",
    "namespace": "t",
    "fields": [{"name": "x", "type": "long"}, {"name": "label", "type": ["null", "string"]}],
}
HEAD = {
    "type": "record",
    "name": "Head",
    "namespace": "t",
    "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "long"}],
}
SHAPE = {
    "type": "record",
    "name": "Shape",
    "namespace": "t",
    "fields": [
        {"name": "head", "type": "t.Head"},  # inlined: its fields are the shape's own attributes
        {"name": "from", "type": "string"},  # a Python keyword
        {"name": "origin", "type": "t.Point"},
        {"name": "centre", "type": ["null", "t.Point"]},
        {"name": "corners", "type": {"type": "array", "items": "t.Point"}},
        {"name": "grid", "type": {"type": "array", "items": {"type": "array", "items": "long"}}},
        {"name": "tags", "type": ["null", {"type": "array", "items": "string"}]},
        {"name": "area", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "count", "type": "int"},
        {"name": "closed", "type": "boolean"},
        {
            "name": "nested",
            "type": {
                "type": "record",
                "name": "Inner",
                "namespace": "t",
                "fields": [{"name": "y", "type": "long"}],
            },
        },
        {"name": "again", "type": "t.Inner"},
    ],
}
NAMED: dict[str, Any] = {"t.Point": POINT, "t.Head": HEAD}
INLINE = frozenset({"t.Head"})
NUMBERS = [0, 1, -1, 63, 64, -64, -65, 127, 128, 8191, 8192, -8192, 2**31, -(2**40), 2**63 - 1, -(2**63)]


def _writer() -> Any:
    return compile_writer(SHAPE, dict(NAMED), inline_records=INLINE)


def _text(rng: random.Random) -> str:
    return "".join(rng.choices("aZ9 é日🙂", k=rng.choice([0, 1, 31, 63, 64, 5000])))


def _point(rng: random.Random) -> types.SimpleNamespace:
    return types.SimpleNamespace(x=rng.choice(NUMBERS), label=rng.choice([None, _text(rng)]))


def _shape(rng: random.Random) -> types.SimpleNamespace:
    obj = types.SimpleNamespace(
        id=_text(rng),
        n=rng.choice(NUMBERS),
        origin=_point(rng),
        centre=rng.choice([None, _point(rng)]),
        corners=[_point(rng) for _ in range(rng.choice([0, 1, 3, 64, 70]))],
        grid=[[rng.choice(NUMBERS) for _ in range(rng.choice([0, 2]))] for _ in range(rng.choice([0, 1, 3]))],
        tags=rng.choice([None, [], [_text(rng) for _ in range(3)]]),
        area=rng.choice([0.0, -1.5, 1e300, 3, rng.random()]),
        ratio=rng.choice([0.0, 0.5, -2.25, 7]),
        count=rng.choice(NUMBERS),
        closed=rng.random() < 0.5,
        nested=types.SimpleNamespace(y=rng.choice(NUMBERS)),
        again=types.SimpleNamespace(y=rng.choice(NUMBERS)),
    )
    setattr(obj, "from", _text(rng))
    return obj


def _as_record(obj: types.SimpleNamespace) -> dict[str, Any]:
    """``obj`` as the dict fastavro writes (the inlined head as a nested record)."""
    record = {k: _plain(v) for k, v in vars(obj).items() if k not in ("id", "n")}
    record["head"] = {"id": obj.id, "n": obj.n}
    return record


def _plain(value: Any) -> Any:
    if isinstance(value, types.SimpleNamespace):
        return {k: _plain(v) for k, v in vars(value).items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _fastavro(obj: types.SimpleNamespace) -> bytes:
    named: dict[str, Any] = {}
    for schema in NAMED.values():
        parse_schema(schema, named_schemas=named)
    parsed = parse_schema(SHAPE, named_schemas=named)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, _as_record(obj))
    return out.getvalue()


@pytest.mark.parametrize("seed", range(40))
def test_writes_what_fastavro_writes_for_nested_schemas(seed: int) -> None:
    obj = _shape(random.Random(seed))
    out = bytearray(b"prefix")
    _writer()(out, obj)
    assert out == b"prefix" + _fastavro(obj)


def test_strings_and_longs_written_before_are_kept_and_written_the_same() -> None:
    """The second write of a string or a long comes from engine.avro's caches: the same bytes
    as fastavro's; a str subclass, a long text and a bad value are written (or refused) as
    ever; and the caches stay bounded however many distinct values pass."""

    class Name(str):
        pass

    string = compile_writer("string", {})
    long_ = compile_writer("long", {})
    values = ["turn-1", "x" * (avro.STRING_KEPT_BYTES + 1), Name("state"), "日本", ""]
    for value in values + values:
        out = bytearray()
        string(out, value)
        assert out == _fastavro_value("string", str(value))
    for n in [1796307162771, -(2**40), 2**63 - 1, 8192] * 2:
        out = bytearray()
        long_(out, n)
        assert out == _fastavro_value("long", n)
    assert "turn-1" in avro._STRINGS and values[1] not in avro._STRINGS
    assert not any(type(kept) is not str for kept in avro._STRINGS)
    with pytest.raises(ValueError, match="lone surrogate"):
        string(bytearray(), "ok\ud800")
    with pytest.raises(OverflowError, match="does not fit an Avro long"):
        long_(bytearray(), 2**63)

    for i in range(3 * avro.VALUES_KEPT):
        string(bytearray(), f"event-{i}")
        long_(bytearray(), 10**12 + i)
    assert len(avro._STRINGS) <= avro.VALUES_KEPT and len(avro._LONGS) <= avro.VALUES_KEPT
    out = bytearray()
    string(out, f"event-{3 * avro.VALUES_KEPT - 1}")
    assert out == _fastavro_value("string", f"event-{3 * avro.VALUES_KEPT - 1}")


def _fastavro_value(schema: Any, value: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parse_schema(schema), value)
    return out.getvalue()


@pytest.mark.parametrize(
    "schema, value",
    [
        ("long", -(2**63)),
        ("string", "naïve"),
        (["null", "double"], 2.5),
        (["null", "double"], None),
        ({"type": "array", "items": "boolean"}, [True, False]),
        ({"type": "string"}, "x" * 9000),
    ],
)
def test_a_schema_that_is_not_a_record_writes_the_value(schema: Any, value: Any) -> None:
    out = bytearray()
    compile_writer(schema, {})(out, value)
    assert out == _fastavro_value(schema, value)


def _error(obj: Any) -> tuple[type[Exception], str]:
    with pytest.raises((TypeError, ValueError, OverflowError)) as info:
        _writer()(bytearray(), obj)
    return info.type, str(info.value)


REFUSED = [
    ("n", 2**63, OverflowError, "field n: 9223372036854775808 does not fit an Avro long"),
    ("n", -(2**63) - 1, OverflowError, "field n: -9223372036854775809 does not fit an Avro long"),
    ("n", True, TypeError, "field n: must be an integer, got True"),
    ("n", 1.0, TypeError, "field n: must be an integer, got 1.0"),
    ("count", "3", TypeError, "field count: must be an integer, got '3'"),
    ("area", True, TypeError, "field area: must be a number, got True"),
    ("area", "1", TypeError, "field area: must be a number, got '1'"),
    ("closed", 1, TypeError, "field closed: must be true or false, got 1"),
    ("from", b"x", TypeError, "field from: must be a string, got b'x'"),
    ("id", None, TypeError, "field id: must be a string, got None"),
    (
        "id",
        "ab\ud800",
        ValueError,
        "field id: is not valid Unicode text: a lone surrogate U+D800 at position 2",
    ),
    (
        "origin.x",
        2**64,
        OverflowError,
        "field origin: field x: 18446744073709551616 does not fit an Avro long",
    ),
    (
        "origin.label",
        "\udfff",
        ValueError,
        "field origin: field label: is not valid Unicode text: a lone surrogate U+DFFF at position 0",
    ),
    ("centre.label", 7, TypeError, "field centre: field label: must be a string, got 7"),
    ("corners.2.x", False, TypeError, "field corners: field x: must be an integer, got False"),
    ("nested.y", None, TypeError, "field nested: field y: must be an integer, got None"),
    ("grid.0.1", 2**70, OverflowError, "field grid: 1180591620717411303424 does not fit an Avro long"),
    ("tags.1", 5, TypeError, "field tags: must be a string, got 5"),
    ("origin", "here", TypeError, "field origin: field x: 'here' is not a Point"),
    ("corners", 7, TypeError, "field corners: object of type 'int' has no len()"),
]
"""(where, value, error, message): values the writers refuse, and what the Python writer says."""


@pytest.mark.parametrize("path, value, error, message", REFUSED)
def test_a_refused_value_names_its_field(path: str, value: Any, error: type[Exception], message: str) -> None:
    kind, text = _error(_refused(path, value))
    assert kind is error
    assert text == message


def _refused(path: str, value: Any) -> types.SimpleNamespace:
    """A shape with ``value`` at ``path`` (dotted; a number indexes a list)."""
    obj = _shape(random.Random(1))
    obj.corners = [_point(random.Random(i)) for i in range(3)]
    obj.grid = [[1, 2]]
    obj.tags = ["a", "b"]
    obj.centre = _point(random.Random(2))
    *parents, last = path.split(".")
    target: Any = obj
    for step in parents:
        target = target[int(step)] if isinstance(target, list) else getattr(target, step)
    if isinstance(target, list):
        target[int(last)] = value
    else:
        setattr(target, last, value)
    return obj


def test_a_missing_attribute_names_the_first_field_it_lacks() -> None:
    obj = _shape(random.Random(3))
    del obj.area
    assert _error(obj) == (TypeError, f"field area: {obj!r} is not a Shape")
    inlined = types.SimpleNamespace(id="x")  # the inlined record's fields are the object's own
    assert _error(inlined) == (TypeError, f"field n: {inlined!r} is not a Shape")


def test_the_first_bad_field_in_wire_order_is_named() -> None:
    obj = _shape(random.Random(4))
    obj.count = None
    del obj.closed  # after count
    assert _error(obj) == (TypeError, "field count: must be an integer, got None")


def test_a_str_subclass_is_a_string() -> None:
    class Name(str):
        pass

    out = bytearray()
    compile_writer("string", {})(out, Name("ok"))
    assert out == b"\x04ok"


@pytest.mark.parametrize(
    "schema, message",
    [
        (["string", "null"], "only"),
        (["null", "string", "long"], "only"),
        ("bytes", "bytes is not supported"),
        ({"type": "map", "values": "long"}, "map is not supported"),
        (
            {"type": "record", "name": "L", "fields": [{"name": "next", "type": ["null", "L"]}]},
            "record L contains itself",
        ),
    ],
)
def test_unsupported_schemas_are_refused_when_compiled(schema: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compile_writer(schema, {})


# --- the native writer (engine/_avrowrite.c) ----------------------------------------------------

NOT_BUILT = (
    "the native Avro writer (engine/_avrowrite.c) was not built: install a C compiler and Python's "
    "headers (Debian: gcc and python3-dev) and reinstall turnlog (pip install -e .)"
)


def _program() -> avro.Program:
    program = avro.compile_program(SHAPE, dict(NAMED), inline_records=INLINE)
    assert program is not None, NOT_BUILT
    return program


def test_the_native_writer_is_built_and_the_codec_uses_it() -> None:
    assert avro.NATIVE, NOT_BUILT
    assert all(c.program is not None for c in codec._registry()[0].values())


@pytest.mark.parametrize("seed", range(40))
def test_the_native_writer_writes_what_fastavro_writes_for_nested_schemas(seed: int) -> None:
    obj = _shape(random.Random(seed))
    expected = _fastavro(obj)
    assert avro.write_native(b"prefix", obj, _program()) == b"prefix" + expected
    obj.corners, obj.grid = tuple(obj.corners), tuple(tuple(row) for row in obj.grid)  # tuples too
    assert avro.write_native(b"", obj, _program()) == expected


def test_the_native_writer_leaves_no_utf8_copy_on_the_strings_it_writes() -> None:
    """A session's history texts live as long as its fold: a UTF-8 copy kept on each (what
    ``PyUnicode_AsUTF8`` does) would more than double their memory in Chinese."""
    text = "物流异常的订单" * 500 + str(random.random())  # a new str, non-ASCII
    size = sys.getsizeof(text)
    event = ev.AssistantMessage(session_id="s", version=2, turn_id="t", message_id="m", text=text)
    assert codec.decode(codec.encode(event)).text == text
    assert sys.getsizeof(text) == size


@pytest.mark.parametrize("path, value, error, message", REFUSED)
def test_the_native_writer_writes_nothing_the_python_writer_refuses(
    path: str, value: Any, error: type[Exception], message: str
) -> None:
    """It raises instead (its own error: the codec then runs the Python writer for the message)."""
    with pytest.raises((TypeError, ValueError, AttributeError)):
        avro.write_native(b"", _refused(path, value), _program())


@pytest.mark.parametrize(
    "program",
    [(), ((0, "x", None),), ((6, "p", ((4, "s", None),)),), ((5 | 16, "a", (0, None, None)),)],
)
def test_a_well_formed_program_passes_the_check(program: Any) -> None:
    assert avro._avrowrite is not None, NOT_BUILT
    avro._avrowrite.check(program)


@dataclasses.dataclass(slots=True)
class _Slotted:
    x: int
    name: str


_X_SLOT = _Slotted.__dict__["x"]


def test_a_field_op_may_name_its_slot_and_reads_it_from_instances_of_its_class() -> None:
    assert avro._avrowrite is not None, NOT_BUILT
    program = ((0, "x", None, _X_SLOT), (4, "name", None, _Slotted.__dict__["name"]))
    avro._avrowrite.check(program)
    expected = _fastavro_value("long", 21) + _fastavro_value("string", "a")
    assert avro.write_native(b"", _Slotted(21, "a"), program) == expected
    # another class's object is read by getattr, not from the slot's offset in it
    assert avro.write_native(b"", types.SimpleNamespace(x=21, name="a"), program) == expected
    with pytest.raises(AttributeError):
        avro.write_native(b"", types.SimpleNamespace(x=21), program)


def test_the_codecs_programs_read_every_event_field_from_its_slot() -> None:
    for c in codec._registry()[0].values():
        assert c.program is not None, NOT_BUILT
        assert all(len(op) == 4 for op in c.program), c.cls.type


@pytest.mark.parametrize(
    "program",
    [
        ((0, "x", None, "x"),),  # a slot that is not a member descriptor
        ((0, "name", None, _X_SLOT),),  # another field's slot
        ((5, "a", (0, None, None, _X_SLOT)),),  # an array's item op with a slot
        [(0, "x", None)],  # a list
        ((0, "x"),),  # two items
        ((9, "x", None),),  # no such op
        ((0, None, None),),  # a field without a name
        ((6, "p", None),),  # a record without its fields
        ((5, "a", (0, "x", None)),),  # an array's item op with a name
        ((5, "a", None),),  # an array without its item op
    ],
)
def test_a_malformed_program_is_refused_by_the_check(program: Any) -> None:
    assert avro._avrowrite is not None, NOT_BUILT
    with pytest.raises(ValueError, match="not an Avro write program"):
        avro._avrowrite.check(program)


# --- through the codec: EventEncodeError naming the field -------------------------------------


def test_a_lone_surrogate_in_a_tool_call_names_the_nested_field() -> None:
    event = ev.AssistantMessage(
        session_id="s",
        version=5,
        turn_id="t",
        message_id="m",
        text="ok",
        tool_calls=(ToolCallSpec("c1", "lookup", "{}"), ToolCallSpec("c2", "lookup", '{"q": "\udc00"}')),
    )
    expected = (
        r"AssistantMessage v5 does not fit its schema: "
        r"field tool_calls: field arguments_json: .* U\+DC00 at position 7"
    )
    with pytest.raises(EventEncodeError, match=expected):
        codec.encode(event)


def test_a_wrong_type_in_a_tool_call_names_the_nested_field() -> None:
    spec = ToolCallSpec("c1", "lookup", "{}")
    object.__setattr__(spec, "name", 5)
    event = ev.AssistantMessage(
        session_id="s", version=2, turn_id="t", message_id="m", text="", tool_calls=(spec,)
    )
    with pytest.raises(EventEncodeError, match="field tool_calls: field name: must be a string, got 5"):
        codec.encode(event)


@pytest.mark.parametrize("field", ["time_ms", "basis_version", "input_tokens"])
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_an_integer_beyond_64_bits_names_the_field(field: str, value: int) -> None:
    event = ev.ModelCallFinished(session_id="s", version=2, turn_id="t", step=0, model="m", status="ok")
    changes: dict[str, Any] = {field: value}
    event = dataclasses.replace(event, **changes)
    with pytest.raises(EventEncodeError, match=rf"field {field}: {value} does not fit an Avro long"):
        codec.encode(event)


def test_an_object_of_another_type_names_the_first_missing_field() -> None:
    writer = codec._registry()[0]["StateChanged"].writer
    other = ev.TurnStarted(session_id="s", version=2, turn_id="t", message_id="m")
    with pytest.raises(TypeError, match=r"field from_state: TurnStarted\(.*\) is not a StateChanged"):
        writer(bytearray(), other)
