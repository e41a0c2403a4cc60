"""Record the current event schemas in ``schemas/history/`` (run after changing a schema).

    python -m turnlog.engine.schema_history

Each event type's schema, in Avro parsing canonical form, is stored once under its fingerprint.
The codec reads old records with the schema that wrote them and resolves them into the current
one, so a log written by an older turnlog stays readable after a schema gains a field (with a
default). ``tests/test_codec.py`` fails when a current schema is missing from the history.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .codec import HISTORY_DIR, SCHEMA_DIR, canonical_schema, wire_fingerprint_of
from .events import EVENT_TYPES


def freeze(schema_dir: Path = SCHEMA_DIR, history_dir: Path = HISTORY_DIR) -> list[Path]:
    """Write every event type's current schema into the history if it is not there; return new files."""
    history_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for type_name in EVENT_TYPES:
        fp = wire_fingerprint_of(type_name, schema_dir).hex()
        path = history_dir / f"{type_name}-{fp}.json"
        if not path.exists():
            entry = {
                "event": type_name,
                "fingerprint": fp,
                "schema": json.loads(canonical_schema(type_name, schema_dir)),
            }
            path.write_text(json.dumps(entry, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")
            written.append(path)
    return written


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_DIR
    for path in freeze(source):
        print(f"recorded {path.relative_to(HISTORY_DIR.parent.parent)}")


if __name__ == "__main__":
    main()
