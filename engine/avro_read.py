"""A compiled Avro binary decoder for the event schemas (the read hot path).

fastavro's ``schemaless_reader`` builds a dict per record (and a nested one for the envelope)
that the codec then turns into an event; reading a log back spends most of its time there.
For each writer schema the codec knows (the current ones and every one in ``schemas/history``)
this module generates the Python source of one function that reads the body straight into the
event's dataclass, compiles it once and caches it. A record an older schema wrote is read with
Avro schema resolution done at compile time: fields the writer lacks take the reader's default,
fields the reader lacks are read and dropped.

It covers what our schemas use (long, int, double, float, boolean, string, ``["null", T]``
unions, arrays, nested records); ``compile_reader`` raises ``Unsupported`` for anything else
and the codec keeps fastavro for that schema. tests/test_avro_read.py checks that every
schema in ``schemas/`` and its history decodes to exactly what fastavro decodes.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Callable

Reader = Callable[[bytes, int], tuple[Any, int]]
"""``read(data, pos)`` -> (the value, the position after it)."""

_DOUBLE = struct.Struct("<d").unpack_from
_FLOAT = struct.Struct("<f").unpack_from


class Unsupported(ValueError):
    """A schema (or a resolution) this compiler does not handle; use fastavro for it."""


class Truncated(ValueError):
    """The body ends inside a value."""


def long_tail(data: bytes, pos: int, first: int) -> tuple[int, int]:
    """The rest of a varint whose first byte (``first``, already read) had its high bit set."""
    z = first & 0x7F
    shift = 7
    while True:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")
    return (z >> 1) ^ -(z & 1), pos


def truncated(what: str) -> Truncated:
    return Truncated(f"the record ends inside {what}")


class _Slotted:
    __slots__ = ("x",)


_MEMBER = type(vars(_Slotted)["x"])
"""The type of a slot's descriptor (``member_descriptor``)."""
_RUNTIME = {
    "_new": object.__new__,
    "_long_tail": long_tail,
    "_double": _DOUBLE,
    "_float": _FLOAT,
    "_truncated": truncated,
}


class _Gen:
    """Source lines of one reader function."""

    def __init__(self, classes: dict[str, type]) -> None:
        self.lines: list[str] = []
        self.n = 0
        self.env: dict[str, Any] = dict(_RUNTIME)
        self.classes = classes

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def const(self, value: Any) -> str:
        name = f"c{len(self.env)}"
        self.env[name] = value
        return name

    # --- values -------------------------------------------------------------------------------

    def long(self, ind: int, target: str) -> None:
        """A zigzag varint, with its one- and two-byte forms inline (versions, lengths)."""
        self.emit(ind, "b = data[pos]; pos += 1")
        self.emit(ind, "if b < 0x80:")
        self.emit(ind + 1, f"{target} = (b >> 1) ^ -(b & 1)")
        self.emit(ind, "elif data[pos] < 0x80:")
        self.emit(ind + 1, "b = (b & 0x7F) | (data[pos] << 7); pos += 1")
        self.emit(ind + 1, f"{target} = (b >> 1) ^ -(b & 1)")
        self.emit(ind, "else:")
        self.emit(ind + 1, f"{target}, pos = _long_tail(data, pos, b)")

    def value(self, ind: int, writer: Any, reader: Any, target: str) -> None:
        """Read a value the writer wrote as ``writer`` into ``target`` as the reader's type."""
        if isinstance(writer, dict) and writer.get("type") not in ("record", "array"):
            writer = writer["type"]
        if isinstance(reader, dict) and reader.get("type") not in ("record", "array"):
            reader = reader["type"]
        if isinstance(writer, str):
            if writer != reader:
                raise Unsupported(f"{writer} read as {reader}")
            self.primitive(ind, writer, target)
        elif isinstance(writer, list):
            self.union(ind, writer, reader, target)
        elif writer["type"] == "array":
            if not isinstance(reader, dict) or reader.get("type") != "array":
                raise Unsupported("an array read as something else")
            self.array(ind, writer["items"], reader["items"], target)
        else:
            if not isinstance(reader, dict) or reader.get("type") != "record":
                raise Unsupported("a record read as something else")
            cls = self.classes.get(_full_name(reader))
            if cls is None:
                raise Unsupported(f"no class for record {_full_name(reader)}")
            self.build(ind, cls, self.record_fields(ind, writer, reader), target)

    def build(self, ind: int, cls: type, fields: dict[str, str], target: str) -> None:
        """``target = cls(**fields)``. A slotted dataclass without ``__post_init__`` whose fields
        are exactly these is built by setting its slots directly: a frozen dataclass's
        ``__init__`` goes through ``object.__setattr__`` per field, twice the cost."""
        names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
        direct = (
            sorted(names) == sorted(fields)
            and "__slots__" in vars(cls)
            and not hasattr(cls, "__post_init__")
            and all(isinstance(getattr(cls, n, None), _MEMBER) for n in names)
        )
        if not direct:
            args = ", ".join(f"{k}={v}" for k, v in fields.items())
            self.emit(ind, f"{target} = {self.const(cls)}({args})")
            return
        self.emit(ind, f"{target} = _new({self.const(cls)})")
        for name, var in fields.items():
            self.emit(ind, f"{self.const(getattr(cls, name).__set__)}({target}, {var})")

    def primitive(self, ind: int, kind: str, target: str) -> None:
        if kind in ("long", "int"):
            self.long(ind, target)
        elif kind == "string":
            n = self.var()
            self.long(ind, n)
            self.emit(ind, f"end = pos + {n}")
            self.emit(ind, f"if {n} < 0 or end > size: raise _truncated('a string')")
            self.emit(ind, f"{target} = data[pos:end].decode(); pos = end")
        elif kind in ("double", "float"):
            width, fn = (8, "_double") if kind == "double" else (4, "_float")
            self.emit(ind, f"if pos + {width} > size: raise _truncated('a {kind}')")
            self.emit(ind, f"{target} = {fn}(data, pos)[0]; pos += {width}")
        elif kind == "boolean":
            self.emit(ind, "b = data[pos]; pos += 1")
            self.emit(ind, "if b > 1: raise ValueError(f'boolean byte {b}')")
            self.emit(ind, f"{target} = b == 1")
        elif kind == "null":
            self.emit(ind, f"{target} = None")
        else:
            raise Unsupported(f"type {kind}")

    def union(self, ind: int, writer: list[Any], reader: Any, target: str) -> None:
        if len(writer) != 2 or writer[0] != "null":
            raise Unsupported(f"union {writer}")
        if not isinstance(reader, list) or len(reader) != 2 or reader[0] != "null":
            raise Unsupported(f"union {writer} read as {reader}")
        self.emit(ind, "b = data[pos]; pos += 1")
        self.emit(ind, "if b == 0:")
        self.emit(ind + 1, f"{target} = None")
        self.emit(ind, "elif b == 2:")
        self.value(ind + 1, writer[1], reader[1], target)
        self.emit(ind, "else:")
        self.emit(ind + 1, "raise ValueError(f'union branch byte {b}')")

    def array(self, ind: int, witem: Any, ritem: Any, target: str) -> None:
        items, count, item = self.var(), self.var(), self.var()
        self.emit(ind, f"{items} = []")
        self.emit(ind, "while True:")
        self.long(ind + 1, count)
        self.emit(ind + 1, f"if {count} == 0: break")
        self.emit(ind + 1, f"if {count} < 0:")
        self.emit(ind + 2, f"{count} = -{count}")
        self.long(ind + 2, "_")  # the block's size in bytes
        self.emit(ind + 1, f"for _ in range({count}):")
        self.value(ind + 2, witem, ritem, item)
        self.emit(ind + 2, f"{items}.append({item})")
        self.emit(ind, f"{target} = tuple({items})")

    def record_fields(self, ind: int, writer: dict[str, Any], reader: dict[str, Any]) -> dict[str, str]:
        """Read a record's fields (writer order) into variables; name -> variable (or a
        constant for a field the writer lacks), in reader order."""
        rfields = {f["name"]: f for f in reader["fields"]}
        got: dict[str, str] = {}
        for field in writer["fields"]:
            rf = rfields.get(field["name"])
            target = self.var()
            if rf is None:
                self.skip(ind, field["type"], target)
                continue
            self.value(ind, field["type"], rf["type"], target)
            got[field["name"]] = target
        out: dict[str, str] = {}
        for name, rf in rfields.items():
            out[name] = got[name] if name in got else self.const(_default(rf))
        return out

    def skip(self, ind: int, writer: Any, target: str) -> None:
        """Read and drop a field the reader no longer has."""
        self.value(ind, writer, _as_reader(writer), target)


def _as_reader(schema: Any) -> Any:
    """``schema`` as its own reader; records become a generic dict so no class is needed."""
    if isinstance(schema, dict) and schema.get("type") == "record":
        raise Unsupported("a dropped record field")
    return schema


def _default(field: dict[str, Any]) -> Any:
    if "default" not in field:
        raise Unsupported(f"field {field['name']} has no default")
    value = field["default"]
    if isinstance(value, (dict, list)) and value:
        raise Unsupported(f"field {field['name']}: a non-empty default {value!r}")
    return () if isinstance(value, list) else value


def _full_name(schema: dict[str, Any]) -> str:
    name: str = schema["name"]
    return name if "." in name or "namespace" not in schema else f"{schema['namespace']}.{name}"


def compile_reader(
    writer: dict[str, Any],
    reader: dict[str, Any],
    cls: type,
    *,
    classes: dict[str, type],
    inline: frozenset[str] = frozenset(),
) -> Callable[[bytes, int], Any]:
    """A function ``read(data, pos)`` that decodes an Avro body written with the record schema
    ``writer`` into ``cls(**fields)`` of the record schema ``reader``, checking that the body
    ends exactly at ``len(data)``. Both schemas must be expanded (named records written out).
    Records named in ``inline`` contribute their fields to the top level (the envelope).
    ``classes`` maps the full names of nested records to the classes built from them."""
    gen = _Gen(classes)
    rfields = {f["name"]: f for f in reader["fields"]}
    kwargs: dict[str, str] = {}
    for field in writer["fields"]:
        rf = rfields.get(field["name"])
        ftype = field["type"]
        if isinstance(ftype, dict) and ftype.get("type") == "record" and _full_name(ftype) in inline:
            if rf is None:
                raise Unsupported(f"inlined record {field['name']} missing from the reader")
            kwargs.update(gen.record_fields(1, ftype, rf["type"]))
            continue
        target = gen.var()
        if rf is None:
            gen.skip(1, ftype, target)
            continue
        gen.value(1, ftype, rf["type"], target)
        kwargs[field["name"]] = target
    for name, rf in rfields.items():
        rtype = rf["type"]
        if name in kwargs or any(f["name"] == name for f in writer["fields"]):
            continue
        if isinstance(rtype, dict) and rtype.get("type") == "record":
            raise Unsupported(f"record field {name} missing from the writer")
        kwargs[name] = gen.const(_default(rf))
    gen.emit(1, "if pos != size: raise ValueError(f'{size - pos} trailing bytes')")
    gen.build(1, cls, kwargs, "event")
    gen.emit(1, "return event")
    source = "def read(data, pos):\n    size = len(data)\n" + "\n".join(gen.lines) + "\n"
    namespace = dict(gen.env)
    exec(compile(source, f"<avro reader {writer['name']}>", "exec"), namespace)  # noqa: S102
    read: Callable[[bytes, int], Any] = namespace["read"]
    read.__doc__ = source  # the generated code, for whoever debugs it
    return read
