"""Reading turnlog's Kafka topic without turnlog: examples/foreign_consumer.py, run in isolated
mode where turnlog cannot be imported, decodes every record turnlog wrote on the real broker,
and one written with an older schema from schemas/history/."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import fastavro
from aiokafka import AIOKafkaProducer

from tests.export_support import ROOT, every_record, record_run
from tests.services import kafka_log, need_service
from turnlog.engine import codec
from turnlog.engine import events as ev
from turnlog.engine.log.base import partition_for
from turnlog.engine.log.kafka import KafkaEventLog

SCRIPT = ROOT / "examples" / "foreign_consumer.py"
BOOT = """
import importlib.util, runpy, sys
sys.path[:0] = [{deps!r}]
if importlib.util.find_spec("turnlog") is not None:
    sys.exit("turnlog is importable here; the foreign consumer must run without it")
sys.argv = [{script!r}, *{args!r}]
runpy.run_path({script!r}, run_name="__main__")
assert not any(m == "turnlog" or m.startswith("turnlog.") for m in sys.modules), "turnlog was imported"
"""
NEEDS = """
import sys, aiokafka, fastavro, fastavro.schema
site = sys.argv[1]
print("\\n".join(sorted({m.__file__[len(site):].lstrip("/").split("/")[0]
    for m in list(sys.modules.values()) if getattr(m, "__file__", None) and m.__file__.startswith(site)})))
"""


def dependencies_only(folder: Path) -> Path:
    """A folder holding only what aiokafka and fastavro import from site-packages (links), so the
    child's path has them and nothing of turnlog (whose editable finder is a .pth file, which
    ``-S`` does not run, and which this folder does not link)."""
    site = str(Path(fastavro.__file__).resolve().parent.parent)
    names = subprocess.run(
        [sys.executable, "-c", NEEDS, site], capture_output=True, text=True, check=True
    ).stdout.split()
    folder.mkdir()
    for name in names:
        if not name.startswith(("turnlog", "__editable__")):
            (folder / name).symlink_to(Path(site) / name)
    return folder


def old_session_created(session_id: str) -> tuple[bytes, str]:
    """A SessionCreated encoded with an older schema of the history (not the current one)."""
    current = codec.schema_fingerprint("SessionCreated").hex()
    path = next(
        p
        for p in sorted((ROOT / "schemas" / "history").glob("SessionCreated-*.json"))
        if json.loads(p.read_text())["fingerprint"] != current
    )
    entry = json.loads(path.read_text())
    schema = fastavro.parse_schema(entry["schema"])
    envelope = {
        "session_id": session_id, "version": 1, "event_id": "e" * 32, "time_ms": 1_700_000_000_000,
        "causation_id": None, "correlation_id": None, "producer": "legacy-producer",
    }  # fmt: skip
    fields = [f["name"] for f in entry["schema"]["fields"][0]["type"]["fields"]]
    record = {
        "envelope": {k: v for k, v in envelope.items() if k in fields},
        "agent_id": "support",
        "user_id": "u-old",
        **{f["name"]: "" for f in entry["schema"]["fields"][1:] if f["name"] not in ("agent_id", "user_id")},
    }
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema, record)
    return codec.MAGIC + bytes.fromhex(entry["fingerprint"]) + body.getvalue(), entry["fingerprint"]


def flat(record: dict[str, Any]) -> dict[str, Any]:
    """A decoded record as the event's fields: envelope first, tool calls as dicts."""
    out = dict(record["envelope"])
    out.update({k: v for k, v in record.items() if k != "envelope"})
    return out


def fields_of(event: ev.Event) -> dict[str, Any]:
    return {f.name: _plain(getattr(event, f.name)) for f in dataclasses.fields(event)}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [dataclasses.asdict(v) for v in value]
    return value


async def test_a_consumer_without_turnlog_decodes_every_record(tmp_path: Path) -> None:
    bootstrap = need_service("TURNLOG_KAFKA_BOOTSTRAP")
    async with kafka_log(bootstrap, partitions=4) as log:
        await record_run(log)
        old_sid = ev.new_id()
        value, old_fp = old_session_created(old_sid)
        assert old_fp != codec.schema_fingerprint("SessionCreated").hex()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(
                log.topics.events, value, key=old_sid.encode(), partition=partition_for(old_sid, 4)
            )
        finally:
            await producer.stop()

        deps = dependencies_only(tmp_path / "deps")
        args = ["--bootstrap", bootstrap, "--topic", log.topics.events, "--schemas", str(ROOT / "schemas")]
        boot = BOOT.format(deps=str(deps), script=str(SCRIPT), args=args)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", boot, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        lines = [json.loads(line) for line in out.decode().splitlines()]
        assert not [line for line in lines if "error" in line]

        reader = KafkaEventLog(bootstrap, topic=log.topics.events, partitions=4, owner=False)
        await reader.start()
        try:
            records = await every_record(reader)  # turnlog's own reading of the same topic
        finally:
            await reader.close()
    decoded = {(line["partition"], line["offset"]): line for line in lines}
    assert len(decoded) == len(records) > 100
    for r in records:
        line = decoded[(r.partition, r.offset)]
        assert line["type"] == r.event.type
        assert flat(line["record"]) == fields_of(r.event), (r.event.type, r.offset)
    (old,) = [line for line in lines if line["record"]["envelope"]["session_id"] == old_sid]
    assert (old["schema"], old["fingerprint"], old["type"]) == ("history", old_fp, "SessionCreated")
    assert old["record"]["envelope"]["basis_version"] == 0  # a field added since: its default
    assert old["record"]["user_id"] == "u-old"
    assert sum(line["schema"] == "current" for line in lines) == len(lines) - 1
