"""Read turnlog's Kafka topic without turnlog: aiokafka, fastavro and the files in schemas/ only.

    pip install aiokafka fastavro
    python foreign_consumer.py --bootstrap 127.0.0.1:9092 --topic turnlog.events --schemas schemas/

Prints one JSON line per record: partition, offset, event type, the writer schema's fingerprint,
whether that schema is the current one or an older one from schemas/history/, and the decoded
record (its envelope fields, then its own). Reads every partition from the start up to the end
as of when it started (``--follow``: and then on, until Ctrl-C). Records that are not turnlog
events are reported with ``"error"``, never skipped silently.

The format (docs/analytics.md): ``C3 01`` + the 8-byte CRC-64-AVRO fingerprint of the writer
schema + the Avro binary body. This file deliberately imports nothing from turnlog.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

import fastavro
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

MAGIC = b"\xc3\x01"
SHARED = ("Envelope", "ToolCallSpec")
"""Named records the event schemas refer to by name."""


def load_schemas(folder: Path) -> dict[bytes, dict[str, Any]]:
    """Wire fingerprint -> {type, writer (schema), reader (schema), current} for every event schema
    in ``folder`` (``*.avsc``) and its ``history/`` (older writer schemas)."""
    named: dict[str, Any] = {}
    for name in SHARED:
        parse_schema(json.loads((folder / f"{name}.avsc").read_text()), named_schemas=named)
    current: dict[str, Any] = {}
    by_fp: dict[bytes, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.avsc")):
        if path.stem in SHARED:
            continue
        raw = json.loads(path.read_text())
        parsed = parse_schema(raw, named_schemas=dict(named))
        expanded = parse_schema(raw, named_schemas=dict(named), expand=True)
        fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(expanded), "CRC-64-AVRO"))
        current[path.stem] = parsed
        by_fp[fp] = {"type": path.stem, "writer": parsed, "reader": None, "current": True}
    for path in sorted((folder / "history").glob("*.json")):
        entry = json.loads(path.read_text())
        fp = bytes.fromhex(entry["fingerprint"])
        if fp not in by_fp and entry["event"] in current:
            writer, reader = parse_schema(entry["schema"]), current[entry["event"]]
            by_fp[fp] = {"type": entry["event"], "writer": writer, "reader": reader, "current": False}
    return by_fp


def decode(value: bytes, schemas: dict[bytes, dict[str, Any]]) -> dict[str, Any]:
    """One record as {type, fingerprint, schema, record}, or {error} if it is not one of ours."""
    if value is None or len(value) < 10 or value[:2] != MAGIC:
        return {"error": "not an Avro single-object record (no C3 01 marker)"}
    fp = value[2:10]
    known = schemas.get(fp)
    if known is None:
        return {"error": f"unknown schema fingerprint {fp.hex()}", "fingerprint": fp.hex()}
    record = fastavro.schemaless_reader(io.BytesIO(value[10:]), known["writer"], known["reader"])
    return {
        "type": known["type"],
        "fingerprint": fp.hex(),
        "schema": "current" if known["current"] else "history",
        "record": record,
    }


async def partitions_of(bootstrap: str, topic: str) -> list[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if described.get("error_code") or not described.get("partitions"):
        raise SystemExit(f"no topic {topic!r} on {bootstrap}")
    return sorted(p["partition"] for p in described["partitions"])


async def consume(bootstrap: str, topic: str, schemas: dict[bytes, dict[str, Any]], follow: bool) -> int:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",  # turnlog writes in transactions
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    printed = 0
    try:
        partitions = [TopicPartition(topic, p) for p in await partitions_of(bootstrap, topic)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        while follow or [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, messages in batches.items():
                for m in messages:
                    if not follow and m.offset >= ends[tp]:
                        continue
                    line = {"partition": tp.partition, "offset": m.offset, **decode(m.value, schemas)}
                    print(json.dumps(line, ensure_ascii=False, default=str), flush=True)
                    printed += 1
    finally:
        await consumer.stop()
    return printed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap address, host:port")
    ap.add_argument("--topic", default="turnlog.events", help="turnlog's events topic")
    ap.add_argument("--schemas", type=Path, default=Path(__file__).resolve().parent.parent / "schemas")
    ap.add_argument("--follow", action="store_true", help="keep reading what is appended")
    args = ap.parse_args()
    if not (args.schemas / "Envelope.avsc").exists():
        raise SystemExit(f"no turnlog schemas in {args.schemas}; pass --schemas path/to/turnlog/schemas")
    printed = asyncio.run(consume(args.bootstrap, args.topic, load_schemas(args.schemas), args.follow))
    print(f"{printed} records", file=sys.stderr)


if __name__ == "__main__":
    main()
