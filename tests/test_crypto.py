"""Content encryption per session (engine.crypto): the content table is complete, values are
sealed on disk and bound to their session, event and field, old plaintext logs stay readable,
an erased session reads as erased everywhere (in another process too), and the master key
rotates without rewriting the log."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from tests.erasure_support import hits, markers_of, pg_cipher, planted, random_master
from tests.services import need_service
from turnlog.engine import codec
from turnlog.engine import events as ev
from turnlog.engine.codec import ENVELOPE_FIELDS
from turnlog.engine.crypto.cipher import ContentCipher
from turnlog.engine.crypto.fields import CONTENT, ERASED_OBJECT, ERASED_TEXT, METADATA, scrubbed
from turnlog.engine.crypto.keystore_sqlite import SqliteKeyStore
from turnlog.engine.crypto.master import MasterKeys
from turnlog.engine.crypto.rotation import rotate_file
from turnlog.engine.crypto.sealed import PREFIX
from turnlog.engine.errors import KeyStoreError, MalformedEventError
from turnlog.engine.log.sqlite import SqliteEventLog
from turnlog.engine.log.sqlite_batch import split_batch

SID = "5f0a6e2b7c1d4e8fa9b0c1d2e3f4a5b6"


def test_every_str_field_of_every_event_is_content_or_metadata() -> None:
    for name, cls in ev.EVENT_TYPES.items():
        texts = {
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in ENVELOPE_FIELDS and ("str" in str(f.type) or "ToolCallSpec" in str(f.type))
        }
        content, metadata = set(CONTENT.get(name, {})), set(METADATA.get(name, ()))
        assert not content & metadata, f"{name}: {content & metadata} is both content and metadata"
        assert texts == content | metadata, (
            f"{name}: unlisted {texts - content - metadata}, unknown {(content | metadata) - texts}"
        )


async def test_the_embedded_log_holds_no_content_in_the_clear(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db", partitions=2, compress=False)  # raw bytes would show plaintext
    written = planted(SID, "PLANTxq")
    await log.append(written, expected_version=0)
    assert await log.read_session(SID) == written
    stored = [bytes(v) for (v,) in log._db.execute("SELECT value FROM batches").fetchall()]
    await log.close()
    files = [tmp_path / n for n in ("log.db", "log.db-wal", "log.keys.db", "log.keys.db-wal")]
    assert hits(files, markers_of(written, "PLANTxq")) == {}
    assert stat.S_IMODE((tmp_path / "master.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "log.keys.db").stat().st_mode) == 0o600
    # stock Avro readers (fastavro) decode every record: content is sealed text
    raw = [codec.decode_fastavro(r) for value in stored for r in split_batch(value)]
    sealed = [getattr(e, f) for e in raw for f, shape in CONTENT[e.type].items() if shape != "calls"]
    assert sealed and all(value.startswith(PREFIX) for value in sealed)
    assert raw[0].session_id == SID and raw[0].agent_id == "a"  # metadata stays clear


async def test_a_log_written_before_encryption_stays_readable(tmp_path: Path) -> None:
    old = SqliteEventLog(tmp_path / "log.db", encrypt=False, compress=False)  # raw bytes show plaintext
    before = planted(SID, "OLDxq")
    await old.append(before[:3], expected_version=0)
    await old.close()
    assert hits([tmp_path / "log.db", tmp_path / "log.db-wal"], ["OLDxq-UserMessageReceived-text"])
    log = SqliteEventLog(tmp_path / "log.db", compress=False)
    await log.append(before[3:], expected_version=3)
    assert await log.read_session(SID) == before
    await log.close()
    assert not hits([tmp_path / "log.db"], ["OLDxq-ToolCallFinished-content"])


def test_a_sealed_value_opens_only_in_its_session_event_and_field(tmp_path: Path) -> None:
    cipher = ContentCipher(SqliteKeyStore(tmp_path / "k.db"), random_master())
    event = ev.UserMessageReceived(session_id=SID, version=2, message_id="m", text="hello")
    sealed = cipher.seal(event)
    assert sealed.text.startswith(PREFIX) and cipher.open(sealed) == event
    for moved in (
        dataclasses.replace(sealed, event_id=ev.new_id()),
        ev.HistoryRecalled(
            session_id=SID,
            version=3,
            event_id=event.event_id,
            turn_id="t",
            query="",
            refs_json="[]",
            text=sealed.text,
        ),
    ):
        with pytest.raises(MalformedEventError, match="does not open with its session's key"):
            cipher.open(moved)
    cut = dataclasses.replace(sealed, text=sealed.text[:-4] + "AAAA")
    with pytest.raises(MalformedEventError):
        cipher.open(cut)


async def test_an_erased_session_reads_erased_in_every_process(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log, other = SqliteEventLog(path, compress=False), SqliteEventLog(path, compress=False)
    erased, kept = planted(SID, "GONExq"), planted("another-session", "KEPTxq")
    await log.append(erased, expected_version=0)
    await log.append(kept, expected_version=0)
    assert await other.read_session(SID) == erased  # the other process has the key cached now
    cipher = log.records.sealer
    assert isinstance(cipher, ContentCipher)
    assert cipher.keys.destroy([SID], "e1", ev.now_ms()) == [SID]
    cipher.forget(SID)
    for reader in (log, other):
        read = await reader.read_session(SID)
        assert read == [scrubbed(e) for e in erased]
        assert not markers_of(read, "GONExq")
        assert await reader.read_session("another-session") == kept
    late = ev.UserMessageReceived(
        session_id=SID, version=len(erased) + 1, message_id="late", text="GONExq-late"
    )
    await other.append(
        [late], expected_version=len(erased)
    )  # new content of an erased session is written erased
    assert (await log.read_session(SID, len(erased)))[0].text == ERASED_TEXT
    await log.close()
    await other.close()
    assert hits([path, path.with_name("log.db-wal")], ["GONExq-late"]) == {}


def test_erased_values_keep_their_fields_parseable() -> None:
    shapes = {shape for fields in CONTENT.values() for shape in fields.values()}
    assert shapes == {"text", "object", "list", "state", "calls"}
    for event in (scrubbed(e) for e in planted(SID, "X")):
        for field, shape in CONTENT[event.type].items():
            value = getattr(event, field)
            if shape == "calls":
                assert [c.arguments_json for c in value] == [ERASED_OBJECT]
            elif shape in ("object", "list"):
                assert isinstance(__import__("json").loads(value), dict if shape == "object" else list)
            else:
                assert value == ERASED_TEXT


async def test_the_master_key_rotates_without_rewriting_the_log(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db")
    written = planted(SID, "ROTxq")
    await log.append(written, expected_version=0)
    await log.close()
    rows_before = (tmp_path / "log.db").read_bytes()
    old_key = (tmp_path / "master.key").read_text()
    store = SqliteKeyStore(tmp_path / "log.keys.db")
    key_id, moved = rotate_file(store, tmp_path / "master.key")
    store.close()
    assert moved == 1 and (tmp_path / "master.key").read_text() != old_key
    assert len((tmp_path / "master.key").read_text().split()) == 1  # the old key is gone from the file
    assert (tmp_path / "log.db").read_bytes() == rows_before
    reopened = SqliteEventLog(tmp_path / "log.db")
    assert await reopened.read_session(SID) == written
    await reopened.close()
    os.environ["TURNLOG_MASTER_KEY"] = old_key.strip()  # a process with the old key only
    try:
        with pytest.raises(KeyStoreError, match=f"master key {key_id}"):
            stale = SqliteEventLog(tmp_path / "log.db")
            try:
                await stale.read_session(SID)
            finally:
                await stale.close()
    finally:
        del os.environ["TURNLOG_MASTER_KEY"]


def test_a_master_key_must_be_given_to_a_process_that_has_no_default() -> None:
    saved = {
        k: os.environ.pop(k) for k in ("TURNLOG_MASTER_KEY", "TURNLOG_MASTER_KEY_FILE") if k in os.environ
    }
    try:
        with pytest.raises(Exception, match="set TURNLOG_MASTER_KEY"):
            MasterKeys.load(None)
    finally:
        os.environ.update(saved)


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_the_key_store_keeps_keys_erasures_and_their_progress(where: str, tmp_path: Path) -> None:
    if where == "postgres":
        with pg_cipher(need_service("TURNLOG_POSTGRES_DSN")) as cipher:
            _exercise(cipher)
    else:
        _exercise(ContentCipher(SqliteKeyStore(tmp_path / "k.db"), random_master()))


def _exercise(cipher: ContentCipher) -> None:
    keys = cipher.keys
    for i in range(3):
        cipher.seal(
            ev.SessionCreated(session_id=f"s{i}", version=1, agent_id="a", user_id="ann" if i < 2 else "bob")
        )
    assert keys.sessions_of("ann") == ["s0", "s1"]
    seq, _ = keys.erased_since(1 << 62)
    assert keys.destroy(["s0", "never-written"], "e1", 5) == ["s0", "never-written"]
    assert keys.destroy(["s0"], "e2", 6) == []  # already erased
    now, erased = keys.erased_since(seq)
    assert now > seq and sorted(erased) == ["never-written", "s0"]
    assert keys.get("s0").erased and keys.get("never-written").master_key_id == ""  # type: ignore[union-attr]
    record = keys.begin_erasure(
        __import__("turnlog.engine.crypto.keystore", fromlist=["ErasureRecord"]).ErasureRecord(
            "r1", "user", "ann", "test", "admin", "pending", 1, None, 0, 0
        ),
        ["s0", "s1"],
    )
    assert (record.sessions, record.done, record.state) == (2, 0, "pending")
    keys.sessions_done("r1", ["s0"])
    assert keys.erasure_sessions("r1", done=False) == ["s1"]
    assert [r.erasure_id for r in keys.pending_erasures("user", "ann")] == ["r1"]
    keys.finish_erasure("r1", 9)
    assert keys.pending_erasures() == [] and keys.erasure("r1").state == "done"  # type: ignore[union-attr]
    keys.purge()


def test_a_large_value_is_compressed_before_it_is_sealed(tmp_path: Path) -> None:
    cipher = ContentCipher(SqliteKeyStore(tmp_path / "k.db"), random_master())
    state = '{"m": [' + ",".join(f'["user", "where is order A-{i}?"]' for i in range(200)) + "]}"
    event = ev.SnapshotTaken(
        session_id=SID, version=9, state_format=6, status="IDLE", last_tool="", turns=1, input_tokens=0,
        output_tokens=0, message_count=200, keyframe_version=0, state_json=state,
    )  # fmt: skip
    sealed = cipher.seal(event)
    assert len(sealed.state_json) < len(state) / 3  # JSON compresses; its ciphertext would not
    assert cipher.open(sealed) == event


def test_a_field_equal_to_its_twin_is_sealed_once(tmp_path: Path) -> None:
    cipher = ContentCipher(SqliteKeyStore(tmp_path / "k.db"), random_master())
    result = '{"order_id": "A-17", "status": "delayed"}'
    cipher.seal(ev.SessionCreated(session_id=SID, version=1, agent_id="a", user_id="u"))
    finished = ev.ToolCallFinished(
        session_id=SID, version=2, turn_id="t", call_id="c", tool_name="lookup", status="success",
        content=result, output_json=result,
    )  # fmt: skip
    sealed = cipher.seal(finished)
    assert sealed.content.startswith(PREFIX) and sealed.output_json == PREFIX + "=content"
    assert cipher.open(sealed) == finished
    cipher.keys.destroy([SID], "e", 1)
    cipher.forget(SID)
    assert (cipher.open(sealed).content, cipher.open(sealed).output_json) == (ERASED_TEXT, ERASED_OBJECT)
