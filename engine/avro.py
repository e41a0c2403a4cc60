"""A compiled Avro binary encoder for the event schemas (the write hot path).

fastavro's ``schemaless_writer`` costs several microseconds of per-call setup on top of a dict
built for it, and a tree of small per-field writer closures still pays a Python call (plus a
tuple of attribute values and a loop) for every field. An append writes several events per
step, so for each event schema this module generates the Python source of ONE function
``write(out, obj)`` that writes the whole record with every field inlined: the attribute read
(``obj.<name>``), the type check, zigzag varints with their one- and two-byte forms inline,
UTF-8 strings with their length prefix, ``["null", T]`` unions, arrays and nested records. A
short string or a long beyond the two-byte form that was written before is one dict lookup
(``_STRINGS``, ``_LONGS``): an event's ids, names and time repeat from event to event.
It is compiled once (``compile_writer``; the codec keeps the result per event type); the
generated source is the function's ``__doc__``, for whoever debugs it.

Records named in ``inline_records`` (the envelope) read their fields from the same object as
their parent; any other nested record is a separate object read from the attribute. Values
are checked where fastavro would silently convert or truncate them: a long takes only an
``int`` (not bool or float) within 64 bits, a double an int or a float, a boolean only a bool,
a string only a str that is valid Unicode (no lone surrogates). A refused value raises
TypeError, ValueError or OverflowError whose message names the field (``field text: ...``; a
field of a nested record as ``field tool_calls: field name: ...``): each record's code keeps
the name of the field it is writing in a local, and its ``except`` clause (free until
something raises) builds the message from it.

It covers the types our schemas use (long, int, double, float, boolean, string, ``["null", T]``
unions, arrays and nested records). Decoding is compiled the same way (engine.avro_read);
tests/test_codec.py checks that this encoder's bytes equal fastavro's for every event type and
tests/test_avro_write.py does so for nested and edge-case schemas and checks the refusals.
"""

from __future__ import annotations

import keyword
import struct
from typing import Any, Callable, NoReturn

from .crypto.sealed import PREFIX

Writer = Callable[[bytearray, Any], None]
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_ERRORS = (TypeError, ValueError, OverflowError, AttributeError)
_UNSUPPORTED = frozenset({"null", "bytes", "map", "enum", "fixed"})


def _surrogate(s: str, exc: UnicodeEncodeError) -> ValueError:
    """The error for a string UTF-8 cannot encode: it holds a lone surrogate."""
    return ValueError(
        f"is not valid Unicode text: a lone surrogate U+{ord(s[exc.start]):04X} at position {exc.start}"
    )


def _fail(exc: Exception, field: str, obj: Any, record: str) -> NoReturn:
    """Re-raise ``exc`` (raised while writing ``field`` of ``obj``) naming the field."""
    if isinstance(exc, AttributeError) and not hasattr(obj, field):
        raise TypeError(f"field {field}: {obj!r} is not a {record}")  # the AttributeError as context
    raise type(exc)(f"field {field}: {exc}") from None


VALUES_KEPT = 4096
"""How many written values each cache (``_STRINGS``, ``_LONGS``) holds before it starts over."""
STRING_KEPT_BYTES = 256
"""Longer strings (message texts, snapshot state) are not kept: they rarely repeat, and the
cache's memory stays under a few MB."""
_STRINGS: dict[str, bytes] = {}
"""Strings as written (length prefix and UTF-8), by value: most of an event's strings repeat
from event to event (its session, turn and call ids, producer, state and tool names), and a hit
is one dict lookup instead of the encode, the length and its varint. Emptied when full, so
one-off strings (event ids) cost a lookup and a store, and the memory stays bounded."""
SEALED = PREFIX
"""An encrypted content value (engine.crypto.sealed) is never kept: its random nonce makes every
one unique, and keeping them would push the strings that do repeat out of ``_STRINGS``."""
_LONGS: dict[int, bytes] = {}
"""Longs the inline forms do not cover (negative, or 8192 and more) as written, by value: the
events of one append share their ``time_ms`` (six bytes). Emptied when full."""


def _keep(cache: dict[Any, bytes], value: Any, written: bytes) -> bytes:
    """Remember ``written`` for ``value`` in ``cache`` (emptied first when full)."""
    if len(cache) >= VALUES_KEPT:
        cache.clear()
    cache[value] = written
    return written


def _unsigned(z: int) -> bytes:
    """The varint of ``z`` >= 0 (already zigzagged)."""
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _string(s: Any) -> bytes:
    """``s`` as an Avro string (kept in ``_STRINGS``), or the error naming what is wrong."""
    if type(s) is not str and not isinstance(s, str):
        raise TypeError(f"must be a string, got {s!r}")
    try:
        data = s.encode()
    except UnicodeEncodeError as x:
        raise _surrogate(s, x) from None
    written = _unsigned(len(data) << 1) + data
    if len(written) <= STRING_KEPT_BYTES and type(s) is str and not s.startswith(SEALED):
        _keep(_STRINGS, s, written)
    return written


def _long(n: int) -> bytes:
    """The zigzag varint of the long ``n`` (kept in ``_LONGS``); OverflowError beyond 64 bits."""
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise OverflowError(f"{n} does not fit an Avro long")
    return _keep(_LONGS, n, _unsigned((n << 1) ^ (n >> 63)))


_RUNTIME: dict[str, Any] = {
    "_string": _string,
    "_string_kept": _STRINGS.get,
    "_long": _long,
    "_long_kept": _LONGS.get,
    "_double": struct.Struct("<d").pack,
    "_float": struct.Struct("<f").pack,
    "_surrogate": _surrogate,
    "_fail": _fail,
    "_ERRORS": _ERRORS,
}


class _Gen:
    """Source lines of one writer function ``write(out, obj)``; ``a`` is ``out.append``."""

    def __init__(self, named: dict[str, Any], inline: frozenset[str]) -> None:
        self.lines: list[str] = []
        self.n = 0
        self.named = named
        self.inline = inline
        self.open: list[str] = []
        """Records being written out (a record that contains itself cannot be inlined)."""

    def var(self, prefix: str = "v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    # --- values -------------------------------------------------------------------------------

    def value(self, ind: int, schema: Any, src: str) -> None:
        """Write the value held in the local ``src`` as ``schema``."""
        if isinstance(schema, list):
            self.union(ind, schema, src)
        elif isinstance(schema, dict):
            kind = schema["type"]
            if kind == "record":
                self.record(ind, schema, src)
            elif kind == "array":
                self.array(ind, schema["items"], src)
            else:
                self.value(ind, kind, src)
        elif schema in ("long", "int"):
            self.emit(ind, f"if type({src}) is not int:")  # bool and float are refused
            self.emit(ind + 1, f"raise TypeError(f'must be an integer, got {{{src}!r}}')")
            self.varint(ind, src, signed=True)
        elif schema == "string":
            self.string(ind, src)
        elif schema in ("double", "float"):
            self.emit(ind, f"if type({src}) is not float and type({src}) is not int:")
            self.emit(ind + 1, f"raise TypeError(f'must be a number, got {{{src}!r}}')")
            self.emit(ind, f"out += {'_double' if schema == 'double' else '_float'}({src})")
        elif schema == "boolean":
            self.emit(ind, f"if type({src}) is not bool:")
            self.emit(ind + 1, f"raise TypeError(f'must be true or false, got {{{src}!r}}')")
            self.emit(ind, f"a({src})")  # True is 1, False 0
        elif schema in _UNSUPPORTED:
            raise ValueError(f"the Avro type {schema} is not supported")
        else:
            self.value(ind, self.named[schema], src)

    def varint(self, ind: int, src: str, *, signed: bool) -> None:
        """The zigzag varint of the int ``src``; the one- and two-byte forms (versions, counts,
        string lengths) without a loop. ``signed``: ``src`` may be negative or beyond 64 bits."""
        self.emit(ind, f"if 0 <= {src} < 64:" if signed else f"if {src} < 64:")
        self.emit(ind + 1, f"a({src} << 1)")
        self.emit(ind, f"elif 0 < {src} < 8192:" if signed else f"elif {src} < 8192:")
        self.emit(ind + 1, f"a((({src} << 1) & 0x7F) | 0x80)")
        self.emit(ind + 1, f"a({src} >> 6)")
        self.emit(ind, "else:")
        if signed:
            self.emit(ind + 1, f"out += _long_kept({src}) or _long({src})")
            return
        self.emit(ind + 1, f"z = {src} << 1")
        self.emit(ind + 1, "while z > 0x7F:")
        self.emit(ind + 2, "a((z & 0x7F) | 0x80)")
        self.emit(ind + 2, "z >>= 7")
        self.emit(ind + 1, "a(z)")

    def string(self, ind: int, src: str) -> None:
        """A str seen before is one lookup (``_STRINGS``); anything else goes through
        ``_string``, which checks it (not a str, a lone surrogate) and keeps it."""
        data = self.var("d")
        self.emit(ind, f"{data} = _string_kept({src}) if type({src}) is str else None")
        self.emit(ind, f"out += {data} if {data} is not None else _string({src})")

    def union(self, ind: int, branches: list[Any], src: str) -> None:
        if len(branches) != 2 or branches[0] != "null":
            raise ValueError(f'only ["null", T] unions are supported, got {branches}')
        self.emit(ind, f"if {src} is None:")
        self.emit(ind + 1, "a(0)")
        self.emit(ind, "else:")
        self.emit(ind + 1, "a(2)")  # zigzag(1): the second branch
        self.value(ind + 1, branches[1], src)

    def array(self, ind: int, items: Any, src: str) -> None:
        """One block of ``len(src)`` items, then the empty block that ends the array."""
        count, item = self.var("n"), self.var()
        self.emit(ind, f"if {src}:")
        self.emit(ind + 1, f"{count} = len({src})")
        self.varint(ind + 1, count, signed=False)
        self.emit(ind + 1, f"for {item} in {src}:")
        self.value(ind + 2, items, item)
        self.emit(ind, "a(0)")

    def record(self, ind: int, schema: dict[str, Any], obj: str) -> None:
        """The record's fields, read from the object in ``obj``. Any error on the way is
        re-raised naming the field (held in a local while the field is written)."""
        depth = len(self.open)
        fields = self.flat_fields(schema)
        if fields:
            current = self.var("f")
            self.emit(ind, "try:")
            for name, ftype in fields:
                src = self.var()
                plain = name.isidentifier() and not keyword.iskeyword(name)
                self.emit(ind + 1, f"{current} = {name!r}")
                self.emit(ind + 1, f"{src} = {obj}.{name}" if plain else f"{src} = getattr({obj}, {name!r})")
                self.value(ind + 1, ftype, src)
            self.emit(ind, "except _ERRORS as e:")
            self.emit(ind + 1, f"_fail(e, {current}, {obj}, {schema['name']!r})")
        del self.open[depth:]

    def flat_fields(self, schema: dict[str, Any]) -> list[tuple[str, Any]]:
        """(attribute, type) in wire order; inlined records contribute their own fields. The
        record stays open until ``record`` has written it (a record within itself is refused)."""
        full = _full_name(schema)
        if full in self.open:
            raise ValueError(f"record {full} contains itself; recursive records are not supported")
        self.named.setdefault(full, schema)
        self.open.append(full)
        fields: list[tuple[str, Any]] = []
        for field in schema["fields"]:
            ftype = field["type"]
            target = self.named.get(ftype) if isinstance(ftype, str) else None
            if target is not None and _full_name(target) in self.inline:
                fields += self.flat_fields(target)
                self.open.pop()  # its fields are the parent's now; the parent stays open
            else:
                fields.append((field["name"], ftype))
        return fields


def compile_writer(
    schema: Any, named: dict[str, Any], *, inline_records: frozenset[str] = frozenset()
) -> Writer:
    """A function ``write(out, obj)`` appending the Avro binary encoding of ``obj`` as
    ``schema`` to ``out``. ``named`` maps full names to the named records ``schema`` refers
    to (records it defines are added). Records named in ``inline_records`` read their fields
    from the same object as their parent (the envelope's fields live on the event itself)."""
    gen = _Gen(named, inline_records)
    gen.value(1, schema, "obj")
    name = schema.get("name", schema["type"]) if isinstance(schema, dict) else str(schema)
    source = "def write(out, obj):\n    a = out.append\n" + "\n".join(gen.lines) + "\n"
    namespace = dict(_RUNTIME)
    exec(compile(source, f"<avro writer {name}>", "exec"), namespace)  # noqa: S102
    write: Writer = namespace["write"]
    write.__doc__ = source  # the generated code, for whoever debugs it
    return write


def _full_name(schema: dict[str, Any]) -> str:
    name: str = schema["name"]
    return name if "." in name or "namespace" not in schema else f"{schema['namespace']}.{name}"
