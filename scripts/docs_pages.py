"""The docs site's pages that are made, not written: an MkDocs hook (named in mkdocs.yml).

Each page is rendered from the thing it describes, at every build, so it cannot drift from it:
the HTTP API from the gateway's OpenAPI document (``turnlog.gateway.openapi.document``), the
event catalogue from the Avro schemas in ``schemas/`` (each field with its ``doc``), and the
benchmarks page from ``bench/README.md``. ``python scripts/docs_pages.py OUT`` writes them to
a folder, to read them without a build.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"
BENCH = ROOT / "bench" / "README.md"
NAMESPACE = "turnlog.events."
METHODS = ("get", "post", "put", "patch", "delete")


def pages() -> dict[str, str]:
    """Path under docs/ → Markdown of every generated page."""
    return {
        "reference/http.md": http_page(),
        "reference/events.md": events_page(),
        "benchmarks.md": BENCH.read_text(encoding="utf-8"),
    }


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated pages to the build."""
    from mkdocs.structure.files import File

    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files


# -- the HTTP API ---------------------------------------------------------------------------


def http_page() -> str:
    sys.path.insert(0, str(ROOT))
    from turnlog.gateway.openapi import document

    doc = document()
    lines = [
        "# HTTP API",
        "",
        "Generated from the gateway's OpenAPI document (`turnlog.gateway.openapi.document()`, served by a "
        "running gateway at `GET /openapi.json`). Every route takes `Authorization: Bearer KEY` (a key "
        "from `turnlog add-key`) except `/healthz`, `/readyz` and `/viewer`; every refusal is a JSON body "
        '`{"error": code, "detail": text}` (the codes: [the gateway](../guides/gateway.md#refusals)). '
        "How to use them: [the HTTP gateway](../guides/gateway.md).",
        "",
        "| method | path | what it does |",
        "|---|---|---|",
    ]
    operations = [(p, m, op) for p, item in doc["paths"].items() for m, op in item.items() if m in METHODS]
    for path, method, op in operations:
        lines.append(f"| {method.upper()} | [`{path}`](#{_op_anchor(op)}) | {_cell(op.get('summary', ''))} |")
    lines.append("")
    for path, method, op in operations:
        lines += _operation(path, method, op)
    lines += ["## Bodies", ""]
    for name, schema in doc["components"]["schemas"].items():
        lines += _schema_section(name, schema)
    return "\n".join(lines) + "\n"


def _op_anchor(op: dict[str, Any]) -> str:
    return "op-" + str(op["operationId"]).lower()


def _schema_anchor(name: str) -> str:
    return "schema-" + name.lower()


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"## {method.upper()} `{path}` {{#{_op_anchor(op)}}}", "", op.get("summary", "") + ".", ""]
    if op.get("description"):
        lines += [op["description"], ""]
    if op.get("security") == []:
        lines += ["No key needed.", ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | notes |", "|---|---|---|---|---|"]
        for p in params:
            notes = _constraints(p.get("schema", {})) or _cell(p.get("description", ""))
            kind, needed = _type(p.get("schema", {})), "yes" if p.get("required") else "no"
            lines.append(f"| `{p['name']}` | {p['in']} | {kind} | {needed} | {notes} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        lines += [f"Body: {_type(_content_schema(body))}.", ""]
    lines += ["| status | answer |", "|---|---|"]
    for status, answer in op.get("responses", {}).items():
        schema = _content_schema(answer)
        shape = f" ({_type(schema)})" if schema else ""
        lines.append(f"| {status} | {_cell(answer.get('description', ''))}{shape} |")
    return [*lines, ""]


def _content_schema(part: dict[str, Any]) -> dict[str, Any]:
    for content in part.get("content", {}).values():
        return dict(content.get("schema", {}))
    return {}


def _type(schema: dict[str, Any]) -> str:
    """A schema as a short phrase, with a link for a named body."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_schema_anchor(name)})"
    if "oneOf" in schema or "anyOf" in schema:
        return " or ".join(_type(s) for s in schema.get("oneOf", schema.get("anyOf", [])))
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    return str(kind)


def _constraints(schema: dict[str, Any]) -> str:
    notes = []
    if "enum" in schema:
        notes.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    if "const" in schema:
        notes.append(f"`{schema['const']}`")
    bounds = (("minimum", "≥"), ("maximum", "≤"), ("minLength", "length ≥"), ("maxLength", "length ≤"))
    for key, word in bounds:
        if key in schema:
            notes.append(f"{word} {schema[key]}")
    if "default" in schema:
        notes.append(f"default `{json.dumps(schema['default'])}`")
    return "; ".join(notes)


def _schema_section(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#{_schema_anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [schema["description"], ""]
    props = schema.get("properties")
    if not props:
        return [*lines, f"{_type(schema)}.", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required | notes |", "|---|---|---|---|"]
    for field, sub in props.items():
        notes = "; ".join(n for n in (_cell(sub.get("description", "")), _constraints(sub)) if n)
        lines.append(f"| `{field}` | {_type(sub)} | {'yes' if field in required else 'no'} | {notes} |")
    return [*lines, ""]


# -- the event catalogue ----------------------------------------------------------------------


def load_schemas() -> dict[str, dict[str, Any]]:
    """Every schema of ``schemas/``, by record name."""
    found = {}
    for path in sorted(SCHEMAS.glob("*.avsc")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        found[schema["name"]] = schema
    return found


def events_page() -> str:
    schemas = load_schemas()
    lines = [
        "# Event catalogue",
        "",
        "Generated from the Avro schemas in `schemas/`, the contract of the log: every event is an "
        "[Envelope](#envelope) followed by its own fields. A record is Avro single-object encoded "
        "(`C3 01`, the schema's CRC-64-AVRO fingerprint, the body); old writer schemas stay readable "
        "(`schemas/history/`). What each event means for a session, and when it is written: "
        "[the log and its events](../concepts/log.md) and the architecture's "
        "[event catalogue](../architecture.md#event-catalogue).",
        "",
        "| event | what it records |",
        "|---|---|",
    ]
    events = {n: s for n, s in schemas.items() if _is_event(s)}
    for name, schema in events.items():
        lines.append(f"| [{name}](#{name.lower()}) | {_cell(schema.get('doc', ''))} |")
    lines.append("")
    for name in ("Envelope", *[n for n in schemas if not _is_event(schemas[n]) and n != "Envelope"]):
        lines += _record(name, schemas[name])
    for name, schema in events.items():
        lines += _record(name, schema)
    return "\n".join(lines) + "\n"


def _is_event(schema: dict[str, Any]) -> bool:
    return any(f["name"] == "envelope" for f in schema["fields"])


def _record(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"## {name}", "", schema.get("doc", ""), ""]
    lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
    for field in schema["fields"]:
        if field["name"] == "envelope":
            continue
        default = f"`{json.dumps(field['default'])}`" if "default" in field else ""
        meaning = _cell(field.get("doc", ""))
        lines.append(f"| `{field['name']}` | {_avro(field['type'])} | {default} | {meaning} |")
    return [*lines, ""]


def _avro(kind: Any) -> str:
    if isinstance(kind, list):
        return " or ".join(_avro(k) for k in kind)
    if isinstance(kind, dict):
        if kind.get("type") == "array":
            return f"array of {_avro(kind['items'])}"
        if kind.get("type") == "map":
            return f"map of {_avro(kind['values'])}"
        return _avro(kind.get("type"))
    if isinstance(kind, str) and kind.startswith(NAMESPACE):
        short = kind[len(NAMESPACE) :]
        return f"[{short}](#{short.lower()})"
    return str(kind)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "site-pages")
    for relative, text in pages().items():
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(target)
