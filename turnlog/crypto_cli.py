"""The work of `turnlog migrate-encrypt` (a log written before encryption copied into a new one
with its content encrypted) and `turnlog rotate-master-key`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from turnlog.engine.crypto.cipher import ContentCipher
from turnlog.engine.crypto.keystore_sql import SqlKeyStore
from turnlog.engine.crypto.migrate import copy_erasures, copy_log
from turnlog.engine.crypto.rotation import rewrap, rotate_file
from turnlog.engine.crypto.setup import MASTER_KEY_FILE, configured_cipher, embedded_cipher, keystore_beside
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.events import now_ms
from turnlog.engine.log.base import EventLog
from turnlog.engine.log.sqlite import SqliteEventLog

from .app import ReadSide, kafka_log

KAFKA_LEFTOVERS = (
    "The old topic {old} (with {old}.inbox, {old}.dead-letter, {old}.live and {old}.sessions) still holds "
    "the plaintext of every record written before encryption, and Kafka cannot delete one session's "
    "records: only whole topics, or old segments by retention. Point every process at --topic {new}, "
    "check it, rebuild the projections from it, then delete the old topics (and any mirror or backup "
    "of them): until then, an erasure cannot reach what they hold."
)


async def migrate(console: Console, side: ReadSide, dest: Path | None, dest_topic: str | None) -> int:
    """Copy the log of ``side`` into ``dest`` (a new embedded folder) or ``dest_topic`` (a new
    Kafka topic), content encrypted; say what the old copy still holds."""
    source, target = await _logs(side, dest, dest_topic)
    try:
        if await _events_in(target):
            raise ConfigurationError("the destination log is not empty: give a new folder or topic")
        with Progress(
            TextColumn("copying events"), BarColumn(), MofNCompleteColumn(), console=console
        ) as bar:
            task = bar.add_task("copy", total=None)
            copied = await copy_log(source, target, on_events=lambda n: bar.advance(task, n))
        erased = 0
        s, t = _cipher(source), _cipher(target)
        if s is not None and t is not None and s.keys is not t.keys:
            erased = copy_erasures(s, t, now_ms())
        console.print(f"copied {copied} events, content encrypted; {erased} erased session(s) stay erased")
    finally:
        await source.close()
        await target.close()
    if dest is not None:
        console.print(
            f"Next: point your processes at --home {dest} (it holds the log, log.keys.db and "
            f"{MASTER_KEY_FILE}: back the last two up apart from the log), run "
            f"`turnlog rebuild --home {dest}`, and delete "
            f"{side.home / 'log.db'} with its -wal and -shm files (and any backup of them): until then they "
            "hold the plaintext. Long-term memories (HOME/memory) are not in the log: move that folder too.",
            highlight=False,
        )
    else:
        console.print(KAFKA_LEFTOVERS.format(old=side.topic, new=dest_topic), highlight=False)
    return 0


async def _logs(side: ReadSide, dest: Path | None, dest_topic: str | None) -> tuple[EventLog, EventLog]:
    if side.kafka is None:
        if dest is None:
            raise ConfigurationError("give --to NEW_HOME: the folder of the encrypted copy")
        if dest.resolve() == side.home.resolve():
            raise ConfigurationError("--to must be another folder than --home")
        old = side.home / "log.db"
        if not old.exists():
            raise ConfigurationError(f"no log at {old}")
        # a log with no key store beside it encrypted nothing: read it as it is (no keys made for it)
        old_log = SqliteEventLog(old, partitions=side.partitions, encrypt=keystore_beside(old).exists())
        dest.mkdir(parents=True, exist_ok=True)
        return old_log, SqliteEventLog(dest / "log.db", partitions=side.partitions)
    if dest_topic is None or dest_topic == side.topic:
        raise ConfigurationError("give --to-topic NEW: a new topic for the encrypted copy")
    if not os.environ.get("TURNLOG_KEYSTORE"):
        raise ConfigurationError(
            "set TURNLOG_KEYSTORE (a PostgreSQL DSN) and the master key: the copy encrypts with them"
        )
    source = kafka_log(side.kafka, side.topic, side.partitions, home=side.home)
    target = kafka_log(
        side.kafka, dest_topic, side.partitions, owner=True, client_id="migrate", home=side.home
    )
    await source.start()
    await target.start()
    await target.wait_owned()
    return source, target


async def _events_in(log: EventLog) -> bool:
    for partition in range(log.partitions):
        if await log.read_partition(partition, 0, 1):
            return True
    return False


def _cipher(log: EventLog) -> ContentCipher | None:
    sealer = getattr(getattr(log, "records", None), "sealer", None)
    return sealer if isinstance(sealer, ContentCipher) else None


def open_logs(side: ReadSide, lines: Iterable[str], out: TextIO) -> int:
    """The gateway's JSON log lines with each sampled context's sealed messages opened (``[erased]``
    for an erased session); other lines as they are."""
    from turnlog.engine.log.sealing import RecordCodec
    from turnlog.gateway.observe.logs import open_context

    cipher = embedded_cipher(side.home / "log.db") if side.kafka is None else configured_cipher(side.home)
    records = RecordCodec(cipher)
    for line in lines:
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            out.write(line)
            continue
        out.write(json.dumps(open_context(parsed, records), ensure_ascii=False) + "\n")
    if cipher is not None:
        cipher.close()
    return 0


def rotate(console: Console, side: ReadSide) -> int:
    """Rewrap every data key under a new master key (a new one in the key file, or the one the
    environment names now); the log is untouched."""
    cipher = embedded_cipher(side.home / "log.db") if side.kafka is None else configured_cipher(side.home)
    if cipher is None:
        raise ConfigurationError("this deployment has no key store (TURNLOG_KEYSTORE): nothing to rotate")
    store = cipher.keys
    assert isinstance(store, SqlKeyStore)
    try:
        if cipher.master.file is not None:
            key_id, moved = rotate_file(store, cipher.master.file)
            console.print(
                f"master key {key_id} now wraps all {moved} data keys; {cipher.master.file} holds only it"
            )
        else:
            moved = rewrap(store, cipher.master)
            console.print(
                f"{moved} data keys rewrapped under master key {cipher.master.current.key_id} "
                "(TURNLOG_MASTER_KEY); drop TURNLOG_OLD_MASTER_KEYS from every process now",
                highlight=False,
            )
    finally:
        store.close()
    return 0
