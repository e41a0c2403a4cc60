"""A compiled Avro binary encoder for the event schemas (the write hot path).

fastavro's ``schemaless_writer`` costs several microseconds of per-call setup on top of a dict
built for it; an append writes several events per step, so the engine compiles each event
schema once into a list of small field writers that read the dataclass attributes directly.
It covers the types our schemas use (long, double, boolean, string, ["null", T] unions,
arrays and nested records). Decoding is compiled too (engine.avro_read); tests/test_codec.py
checks that this encoder's bytes equal fastavro's for every event type.
"""

from __future__ import annotations

import struct
from operator import attrgetter
from typing import Any, Callable

Writer = Callable[[bytearray, Any], None]
_DOUBLE = struct.Struct("<d").pack
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def write_long(out: bytearray, n: Any) -> None:
    if type(n) is not int:  # bool and float are refused: fastavro would silently convert them
        raise TypeError(f"must be an integer, got {n!r}")
    if 0 <= n < 64:  # the common case (versions, counters): one byte
        out.append(n << 1)
        return
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise OverflowError(f"{n} does not fit an Avro long")
    z = (n << 1) ^ (n >> 63)
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)


def write_double(out: bytearray, x: Any) -> None:
    if type(x) is not float and type(x) is not int:
        raise TypeError(f"must be a number, got {x!r}")
    out += _DOUBLE(x)


def write_boolean(out: bytearray, v: Any) -> None:
    if type(v) is not bool:
        raise TypeError(f"must be true or false, got {v!r}")
    out.append(1 if v else 0)


def write_string(out: bytearray, s: Any) -> None:
    if not isinstance(s, str):
        raise TypeError(f"must be a string, got {s!r}")
    try:
        data = s.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 for it, so no Avro string
        raise ValueError(
            f"is not valid Unicode text: a lone surrogate U+{ord(s[exc.start]):04X} at position {exc.start}"
        ) from None
    if len(data) < 64:
        out.append(len(data) << 1)
    else:
        write_long(out, len(data))
    out += data


_PRIMITIVES: dict[str, Writer] = {
    "long": write_long,
    "int": write_long,
    "double": write_double,
    "float": write_double,
    "boolean": write_boolean,
    "string": write_string,
}


def compile_writer(
    schema: Any, named: dict[str, Any], *, inline_records: frozenset[str] = frozenset()
) -> Writer:
    """A writer for ``schema``. Records named in ``inline_records`` read their fields from the
    same object as their parent (the envelope's fields live on the event itself)."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        return compile_writer(named[schema], named, inline_records=inline_records)
    if isinstance(schema, list):
        return _union(schema, named, inline_records)
    kind = schema["type"]
    if kind == "record":
        return _record(schema, named, inline_records)
    if kind == "array":
        return _array(compile_writer(schema["items"], named, inline_records=inline_records))
    return compile_writer(kind, named, inline_records=inline_records)


def _record(schema: dict[str, Any], named: dict[str, Any], inline: frozenset[str]) -> Writer:
    fields = _flat_fields(schema, named, inline)
    names = [name for name, _ in fields]
    writers = [writer for _, writer in fields]
    values_of = attrgetter(*names) if len(names) > 1 else (lambda obj: (getattr(obj, names[0]),))

    def write(out: bytearray, obj: Any) -> None:
        try:
            values = values_of(obj)
            for writer, value in zip(writers, values, strict=True):
                writer(out, value)
        except (TypeError, ValueError, OverflowError, AttributeError):
            _explain(schema, fields, obj)  # raises naming the field
            raise

    return write


def _flat_fields(
    schema: dict[str, Any], named: dict[str, Any], inline: frozenset[str]
) -> list[tuple[str, Writer]]:
    """(attribute, writer) in wire order; inlined records contribute their own fields."""
    named.setdefault(_full_name(schema), schema)
    fields: list[tuple[str, Writer]] = []
    for field in schema["fields"]:
        ftype = field["type"]
        target = named.get(ftype) if isinstance(ftype, str) else None
        if target is not None and _full_name(target) in inline:
            fields += _flat_fields(target, named, inline)
        else:
            fields.append((field["name"], compile_writer(ftype, named, inline_records=inline)))
    return fields


def _explain(schema: dict[str, Any], fields: list[tuple[str, Writer]], obj: Any) -> None:
    """Re-run a failed write field by field and raise an error that names the culprit."""
    for name, writer in fields:
        if not hasattr(obj, name):
            raise TypeError(f"field {name}: {obj!r} is not a {schema['name']}")
        try:
            writer(bytearray(), getattr(obj, name))
        except (TypeError, ValueError, OverflowError) as exc:
            raise type(exc)(f"field {name}: {exc}") from None


def _union(branches: list[Any], named: dict[str, Any], inline: frozenset[str]) -> Writer:
    if len(branches) != 2 or branches[0] != "null":
        raise ValueError(f'only ["null", T] unions are supported, got {branches}')
    inner = compile_writer(branches[1], named, inline_records=inline)

    def write(out: bytearray, value: Any) -> None:
        if value is None:
            out.append(0)
        else:
            out.append(2)  # zigzag(1)
            inner(out, value)

    return write


def _array(item: Writer) -> Writer:
    def write(out: bytearray, items: Any) -> None:
        if items:
            write_long(out, len(items))
            for value in items:
                item(out, value)
        out.append(0)

    return write


def _full_name(schema: dict[str, Any]) -> str:
    name = schema["name"]
    return name if "." in name or "namespace" not in schema else f"{schema['namespace']}.{name}"
