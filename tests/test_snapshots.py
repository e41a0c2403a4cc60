"""Snapshots: written after every tool step (a restore point while a full one is near) and turn
end, exact, and where loading starts."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from turnlog.consumers import Projector
from turnlog.engine import (
    Agent,
    AgentDirectory,
    AgentSessions,
    FunctionModel,
    ModelError,
    ModelRequest,
    ModelResponse,
    SqliteEventLog,
    ToolFailure,
    TurnRunner,
    call,
    fold,
    reply,
    snapshots,
    tool,
)
from turnlog.engine import events as ev
from turnlog.engine.errors import SnapshotFormatError
from turnlog.engine.fold import InboundMessage, SessionState, ToolCallProgress, TurnProgress
from turnlog.projections import SqliteProjectionStore

AGENT = "clerk"


@tool(idempotent=True)
async def lookup(order_id: str) -> dict:
    """Look up an order."""
    if order_id.endswith("7"):
        raise ToolFailure(f"order {order_id} not found")
    return {"order_id": order_id, "status": "delayed", "note": "größe ✓"}


def clerk(request: ModelRequest) -> ModelResponse | str:
    """Turn n: n % 5 == 3 fails the model call, n % 4 == 0 answers directly, otherwise one or
    two tool steps (the second with two calls in one batch)."""
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    text = request.messages[last_user].content
    n = int(text.split()[-1])
    done = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if n % 5 == 3 and not done:
        raise ModelError("provider returned 503")
    if n % 4 == 0 or len(done) >= (1 if n % 2 else 3):
        return f"turn {n}: {len(done)} results"
    if not done:
        return reply("", call("lookup", {"order_id": f"O-{n}"}, f"c{n}a"))
    batch = (
        call("lookup", {"order_id": f"O-{n}1"}, f"c{n}b"),
        call("lookup", {"order_id": f"O-{n}7"}, f"c{n}c"),
    )
    return reply("two more", *batch)


async def long_session(log: SqliteEventLog, turns: int) -> tuple[AgentSessions, str]:
    agent = Agent(AGENT, FunctionModel(clerk), [lookup], system_prompt="Be exact.")
    api = AgentSessions(log, AgentDirectory([agent]))
    sid = (await api.create_session(AGENT, "u-1")).session_id
    for n in range(turns):
        if n % 10 == 8:  # queued: the next send runs both turns
            await api.post_user_message(sid, f"queued {n}")
            continue
        async for _ in api.send_user_message(sid, f"please check {n}"):
            pass
    return api, sid


def snapshot_events(events: Sequence[ev.Event]) -> list[ev.SnapshotTaken]:
    return [e for e in events if isinstance(e, ev.SnapshotTaken)]


async def test_every_snapshot_of_a_200_turn_session_folds_to_the_same_state(log: SqliteEventLog) -> None:
    api, sid = await long_session(log, 200)
    events = await log.read_session(sid)
    snaps = snapshot_events(events)
    finished = [e for e in events if isinstance(e, ev.TurnFinished)]
    tool_steps = sum(1 for e in events if isinstance(e, ev.StateChanged) and e.cause == "tool_result")
    assert len(finished) == 200 and tool_steps > 150
    assert len(snaps) == len(finished) + tool_steps  # one per turn end and per tool step
    assert {e.reason for e in finished} == {"answered", "model_error"}
    full_ones = [s for s in snaps if s.holds_state]
    points = [s for s in snaps if not s.holds_state]
    # this agent's turns are short: every tool step's snapshot is a restore point, every turn
    # end's holds the state
    assert len(points) == tool_steps and all(s.state_format == 0 and s.state_json == "" for s in points)
    assert [s.version for s in full_ones] == [e.version + 1 for e in finished]
    assert all(0 < p.version - before.version < snapshots.FULL_EVERY for before, p in _after_full(snaps))

    # One pass: at each snapshot its restored state must equal the fold from version 1 so far;
    # then it is folded forward alongside, and must equal that fold again at the next snapshot
    # (the last one: at the end). So every snapshot, folded on, gives the full fold's state.
    full = fold(sid, events)
    running = SessionState(sid)
    by_version = {s.version: s for s in snaps}
    forward: SessionState | None = None
    history_before: tuple[str, int] | None = None  # the previous full snapshot's turn and history length
    for event in events:
        snap = by_version.get(event.version)
        if snap is not None:
            assert (snap.status, snap.message_count, snap.turns) == (
                running.status,
                len(running.messages),
                running.turns_finished,
            )
            assert (snap.input_tokens, snap.output_tokens) == (running.input_tokens, running.output_tokens)
            if not snap.holds_state:  # a restore point: the full snapshot before it, folded on
                assert await snapshots.state_before(log, snap) == running
                running.apply(event)
                if forward is not None:
                    forward.apply(event)
                continue
            chain = [s for s in full_ones if snap.keyframe_version <= s.version < snap.version]
            chain = chain if snap.keyframe_version else []
            assert await snapshots.chain_of(log, snap) == chain
            restored = snapshots.restore(snap, *chain)
            assert restored == running, f"snapshot v{snap.version} differs from the fold"
            assert await snapshots.state_before(log, snap) == running
            assert forward is None or forward == running, f"folding on to v{snap.version} differs"
            if running.turn is not None:  # dict equality ignores order; the batch order matters
                assert list(restored.turn.tool_calls) == list(running.turn.tool_calls)  # type: ignore[union-attr]
            # a delta of the same turn holds only the history records added since (format 5)
            doc, now = json.loads(snap.state_json), running.turn
            same_turn = snap.keyframe_version and now and history_before and history_before[0] == now.turn_id
            kept = history_before[1] if same_turn and history_before else 0
            assert doc["h"] == kept
            assert now is None or len(doc["t"][11]) == len(now.history) - kept
            history_before = None if now is None else (now.turn_id, len(now.history))
            forward = restored
        running.apply(event)
        if forward is not None:
            forward.apply(event)
    assert running == full and forward == full
    first = full_ones[0]
    assert fold(sid, [e for e in events if e.version >= first.version], snapshots.restore(first)) == full
    keyframes = [s for s in full_ones if not s.keyframe_version]
    assert 3 < len(keyframes) < len(full_ones) // 10, "mostly deltas, a keyframe now and then"
    assert max(len(s.state_json) for s in full_ones if s.keyframe_version) < len(keyframes[-1].state_json)
    # a delta holds the messages added since the full snapshot before it, no more (format 4)
    for before, snap in zip(full_ones, full_ones[1:], strict=False):
        if snap.keyframe_version:
            doc = json.loads(snap.state_json)
            assert doc["p"] == before.version and doc["k"] == before.message_count
            assert len(doc["m"]) == snap.message_count - before.message_count
    # the summaries say what happened at each snapshot
    assert {s.last_tool for s in snaps} == {"lookup", ""}


def _after_full(snaps: Sequence[ev.SnapshotTaken]) -> list[tuple[ev.SnapshotTaken, ev.SnapshotTaken]]:
    """Each restore point with the newest snapshot before it that holds a state."""
    pairs, last_full = [], None
    for snap in snaps:
        if snap.holds_state:
            last_full = snap
        elif last_full is not None:
            pairs.append((last_full, snap))
    return pairs


async def test_a_long_turn_holds_the_state_at_least_every_full_every_events(log: SqliteEventLog) -> None:
    """Restore points keep a short turn's snapshots small; a long turn still writes one that
    holds the state once the last is ``FULL_EVERY`` events back, so a load mid-turn folds at
    most that many events plus one step's, and every snapshot restores the fold exactly."""
    steps = 30

    def digger(request: ModelRequest) -> ModelResponse | str:
        done = sum(1 for m in request.messages if m.role == "tool")
        return reply("", call("lookup", {"order_id": f"dig-{done}-x"}, f"d{done}")) if done < steps else "dug"

    agent = Agent(AGENT, FunctionModel(digger), [lookup], max_tool_iterations=steps + 1)
    api = AgentSessions(log, AgentDirectory([agent]))
    sid = (await api.create_session(AGENT, "u")).session_id
    async for _ in api.send_user_message(sid, "dig"):
        pass
    events = await log.read_session(sid)
    snaps = snapshot_events(events)
    assert len(snaps) == steps + 1 and isinstance(events[-2], ev.TurnFinished)
    full_ones = [s for s in snaps if s.holds_state]
    assert 2 < len(full_ones) < len(snaps) // 3 and snaps[-1].holds_state
    step_events = 9  # a tool step's events: answer, call requested/started/finished, states, snapshot
    for snap in snaps:
        base = await log.latest_snapshot(sid, at_or_before=snap.version)
        assert base is not None and base.holds_state  # type: ignore[attr-defined]
        assert snap.version - base.version < snapshots.FULL_EVERY + step_events
        before = [e for e in events if e.version < snap.version]
        assert await snapshots.state_before(log, snap) == fold(sid, before)
    assert sum(len(s.state_json) for s in snaps) < 3 * len(snaps[-1].state_json) * len(full_ones)


async def test_a_step_with_a_large_result_holds_the_state_next_to_it(log: SqliteEventLog) -> None:
    """A restore point would leave a large result to the next full snapshot, in a later commit
    than its event (stored twice); so a step that added ``FULL_CHARS`` or more holds the state."""

    @tool(idempotent=True)
    async def page(n: int) -> str:
        """Read a page."""
        return f"page {n}: " + "lorem ipsum " * 250  # 3,000 characters

    def reader(request: ModelRequest) -> ModelResponse | str:
        done = sum(1 for m in request.messages if m.role == "tool")
        return reply("", call("page", {"n": done}, f"p{done}")) if done < 3 else "read"

    api = AgentSessions(log, AgentDirectory([Agent(AGENT, FunctionModel(reader), [page])]))
    sid = (await api.create_session(AGENT, "u")).session_id
    async for _ in api.send_user_message(sid, "read"):
        pass
    snaps = snapshot_events(await log.read_session(sid))
    assert len(snaps) == 4 and all(s.holds_state for s in snaps)
    assert all(len(s.state_json) > 3000 for s in snaps[:3])  # each holds its step's page


async def test_a_cold_load_reads_only_the_events_after_the_latest_snapshot(log_path: Path) -> None:
    class RecordingLog(SqliteEventLog):
        """The real SQLite log, remembering from which version each session read started."""

        reads: list[int] = []

        async def read_session(self, session_id: str, after_version: int = 0) -> list[ev.Event]:
            self.reads.append(after_version)
            return await super().read_session(session_id, after_version)

    log = RecordingLog(log_path, partitions=4)
    try:
        api, sid = await long_session(log, 12)
        await api.post_user_message(sid, "still waiting 1")  # after the last snapshot
        events = await log.read_session(sid)
        latest = snapshot_events(events)[-1]
        assert await log.latest_snapshot(sid) == latest
        log.reads.clear()

        cold = TurnRunner(log, AgentDirectory().get)
        state = await cold.load(sid)
        assert log.reads == [latest.version - 1]
        assert state == fold(sid, events)
        assert state.inbox[-1].text == "still waiting 1"
        fresh_api = AgentSessions(log, api.agents)
        assert await fresh_api.get_state(sid) == state
    finally:
        await log.close()


async def test_a_session_without_snapshots_loads_by_a_full_fold(log: SqliteEventLog) -> None:
    agent = Agent(AGENT, FunctionModel(clerk), [lookup])
    api = AgentSessions(log, AgentDirectory([agent]))
    sid = (await api.create_session(AGENT, "u")).session_id
    await api.post_user_message(sid, "please check 1")
    assert await log.latest_snapshot(sid) is None
    state = await TurnRunner(log, api.agents.get).load(sid)
    assert state == fold(sid, await log.read_session(sid)) and len(state.inbox) == 1


async def test_an_unknown_snapshot_format_is_refused_and_loading_folds_from_the_start(
    log: SqliteEventLog,
) -> None:
    api, sid = await long_session(log, 3)
    version = await log.session_version(sid)
    future = ev.SnapshotTaken(
        session_id=sid,
        version=version + 1,
        state_format=99,
        status="FINISHED",
        last_tool="",
        turns=3,
        input_tokens=0,
        output_tokens=0,
        message_count=0,
        keyframe_version=0,
        state_json='{"written": "by a newer turnlog"}',
    )
    await log.append([future], expected_version=version)
    with pytest.raises(SnapshotFormatError, match="snapshot format 99 is not one this turnlog reads"):
        snapshots.restore(future)
    state = await TurnRunner(log, api.agents.get).load(sid)
    assert state == fold(sid, await log.read_session(sid))
    assert state.turns_finished == 3


async def test_a_delta_whose_keyframe_is_missing_is_refused_and_loading_folds_from_the_start(
    log: SqliteEventLog,
) -> None:
    api, sid = await long_session(log, 40)
    events = await log.read_session(sid)
    delta = snapshot_events(events)[-1]
    assert delta.keyframe_version
    with pytest.raises(SnapshotFormatError, match=f"its keyframe v{delta.keyframe_version} is missing"):
        snapshots.restore(delta)
    wrong = snapshot_events(events)[-2]
    with pytest.raises(SnapshotFormatError, match="is missing"):
        snapshots.restore(delta, wrong)
    chain = await snapshots.chain_of(log, delta)
    assert chain[0].version == delta.keyframe_version and len(chain) > 2
    for gap in (1, len(chain) - 1):  # a link of the chain missing: refused, never a wrong state
        with pytest.raises(SnapshotFormatError, match="previous snapshot of its chain"):
            snapshots.restore(delta, *chain[:gap], *chain[gap + 1 :])
    assert snapshots.restore(delta, *chain) == fold(sid, [e for e in events if e.version < delta.version])


def test_a_corrupt_snapshot_names_the_record() -> None:
    with pytest.raises(SnapshotFormatError, match=r"session s v9: corrupt snapshot: JSONDecodeError"):
        snapshots.decode_state("{not json", snapshots.FORMAT, where="session s v9")
    with pytest.raises(SnapshotFormatError, match="corrupt snapshot: ValueError: zip"):
        snapshots.decode_state('{"s": [], "i": [], "t": null, "m": []}', snapshots.FORMAT, where="v9")
    doc = json.loads(snapshots.encode_state(SessionState("s", 3)))
    del doc["m"]
    with pytest.raises(SnapshotFormatError, match="corrupt snapshot: KeyError: 'm'"):
        snapshots.decode_state(json.dumps(doc), snapshots.FORMAT, where="v9")


def test_a_snapshot_of_every_field_round_trips_exactly() -> None:
    from collections import deque

    from turnlog.engine import ChatMessage
    from turnlog.engine.states import SessionStatus
    from turnlog.engine.tools.guards import CallRecord

    turn = TurnProgress(
        "t1", "m1", 7, iterations=2, model_calls=3, model_calls_started=4, model_call_open=True,
        last_answer="almost", input_tokens=11, output_tokens=12, stop_reason="enough", stop_actor="admin",
        history=[CallRecord("c0", "lookup", '{"order_id": "a"}', 1, "success", "found a")],
        guard="repeated_call", guard_reason="lookup three times", cost_micros=13,
    )  # fmt: skip
    turn.tool_calls = {
        "c2": ToolCallProgress("c2", "lookup", '{"order_id": "b"}', "started", 1, 2, "", "", 1700, 1800),
        "c1": ToolCallProgress("c1", "send", "{bad json", "requested", 0, 2, "pending", "too many"),
    }
    state = SessionState(
        "s", 42, "agent", "user", "admin", "m-1", SessionStatus.TOOL_LOOP,
        messages=[
            ChatMessage.user("hi \u2028 \"quoted\" 日本"),
            ChatMessage("assistant", "", (ev.ToolCallSpec("c1", "send", "{bad json"),)),
            ChatMessage("tool", "[FAILED] nope", tool_call_id="c1", name="send"),
        ],
        inbox=deque([InboundMessage("m2", "next", "e2", 41)]),
        turn=turn, turns_finished=5, closed=True, close_reason="why", input_tokens=100,
        output_tokens=200, cost_micros=300, superseded={"c0": "c2"}, created_ms=1, updated_ms=2,
    )  # fmt: skip
    text = snapshots.encode_state(state)
    back = snapshots.decode_state(text, snapshots.FORMAT, where="test")
    assert back == state and list(back.turn.tool_calls) == ["c2", "c1"]  # type: ignore[union-attr]
    json.loads(text)  # plain JSON

    # the encoder: a keyframe first, then deltas on it until the delta limit, then a keyframe
    encoder = snapshots.SnapshotEncoder(delta_limit=2)
    first = encoder.encode(state, 43)
    assert first == snapshots.Encoded(text, 0)
    grown = [ChatMessage("assistant", "done"), ChatMessage.user("more")]
    previous, previous_version, previous_turn = back.messages, 43, back.turn
    for i, message in enumerate(grown):
        state.messages.append(message)
        turn.history.append(CallRecord(f"c{3 + i}", "lookup", "{}", 2, "success", f"found {i}"))
        delta = encoder.encode(state, 44 + i)
        assert delta.keyframe_version == 43 and len(delta.state_json) < len(text)
        doc = json.loads(delta.state_json)  # only what changed since the last one
        assert len(doc["m"]) == 1 and doc["h"] == 1 + i and [r[0] for r in doc["t"][11]] == [f"c{3 + i}"]
        chain = "previous snapshot of its chain"
        wanted = f"needs the {len(previous)} messages of the {chain} v{previous_version}"
        with pytest.raises(SnapshotFormatError, match=wanted):
            snapshots.decode_state(delta.state_json, snapshots.FORMAT, where="d")
        with pytest.raises(SnapshotFormatError, match=wanted):
            snapshots.decode_state(
                delta.state_json, snapshots.FORMAT, where="d", base=previous, base_version=0
            )
        fresh = dataclasses.replace(turn, turn_id="t2")
        for wrong_turn in (None, fresh):  # the turn the history records come from is needed
            with pytest.raises(SnapshotFormatError, match=f"needs the {1 + i} tool calls of its turn"):
                snapshots.decode_state(
                    delta.state_json, snapshots.FORMAT, where="d", base=previous,
                    base_version=previous_version, base_turn=wrong_turn,
                )  # fmt: skip
        decoded = snapshots.decode_state(
            delta.state_json, snapshots.FORMAT, where="d", base=previous,
            base_version=previous_version, base_turn=previous_turn,
        )  # fmt: skip
        assert decoded == state
        previous, previous_version, previous_turn = decoded.messages, 44 + i, decoded.turn
    state.messages.append(ChatMessage("assistant", "again"))
    assert encoder.encode(state, 46) == snapshots.Encoded(snapshots.encode_state(state), 0)
    assert encoder.encode(state, 47).keyframe_version == 46
    # a reloaded state (a new history list) never gets a delta on the old fold's keyframe
    reloaded = snapshots.decode_state(snapshots.encode_state(state), snapshots.FORMAT, where="r")
    assert encoder.encode(reloaded, 48).keyframe_version == 0


def test_the_snapshot_layout_covers_every_field_of_the_state() -> None:
    """A new field in the folded state needs a new snapshot format (see engine/snapshots.py)."""

    def names(cls: type) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    assert names(SessionState) == [*snapshots.SESSION_FIELDS[:7], "messages", "inbox", "turn",
                                   *snapshots.SESSION_FIELDS[7:]]  # fmt: skip
    assert names(TurnProgress) == [*snapshots.TURN_FIELDS[:7], "tool_calls", *snapshots.TURN_FIELDS[7:]]
    assert names(ToolCallProgress) == list(snapshots.CALL_FIELDS)
    assert names(InboundMessage) == list(snapshots.INBOX_FIELDS)


async def test_the_snapshots_projection_lists_what_happened_at_each(
    tmp_path: Path, log: SqliteEventLog
) -> None:
    api, sid = await long_session(log, 6)
    store = SqliteProjectionStore(tmp_path / "p.db")
    try:
        await Projector(log, store).catch_up()
        rows = store.rows_of("snapshots", sid)
        snaps = snapshot_events(await log.read_session(sid))
        assert [r["version"] for r in rows] == [s.version for s in snaps]
        assert [(r["status"], r["last_tool"], r["output_tokens"]) for r in rows] == [
            (s.status, s.last_tool, s.output_tokens) for s in snaps
        ]
        assert rows[-1]["turns"] == 6 and rows[-1]["status"] == "FINISHED"
        assert store.session(sid)["state_version"] == snaps[-1].version  # type: ignore[index]
    finally:
        store.close()


def as_format_1(state_json: str) -> str:
    """A current snapshot body rewritten as format 1 wrote it: no task state, archived count or
    origin calls, the turn without its context and budget fields, messages without refs."""
    doc = json.loads(state_json)
    doc["s"] = doc["s"][:16]
    if doc["t"] is not None:
        doc["t"] = [*doc["t"][:16], [row[:8] for row in doc["t"][-1]]]
    doc["m"] = [row[:5] for row in doc["m"]]
    return json.dumps(doc)


async def test_a_format_1_snapshot_is_read_with_the_refs_of_its_messages(log: SqliteEventLog) -> None:
    """Sessions written before context management keep loading from their snapshot (not from
    their first event), and their messages get the refs a fold from the start gives them."""
    api, sid = await long_session(log, 10)
    await api.post_user_message(sid, "waiting while the snapshot is taken")
    events = await log.read_session(sid)
    state = fold(sid, events)
    assert state.inbox and len(state.messages) > 30
    old = ev.SnapshotTaken(
        session_id=sid, version=state.version + 1, state_format=1, status=str(state.status), last_tool="",
        turns=state.turns_finished, input_tokens=0, output_tokens=0, message_count=len(state.messages),
        keyframe_version=0, state_json=as_format_1(snapshots.encode_state(state)),
    )  # fmt: skip
    await log.append([old], expected_version=state.version)

    loaded = await snapshots.load_latest(log, sid)
    assert loaded is not None, "read, not refused"
    assert loaded == fold(sid, events), "the state as of the version before the snapshot, refs and all"
    assert [m.ref for m in loaded.messages] == [m.ref for m in state.messages] and loaded.messages[0].ref > 0
    async for _ in api.run_pending(sid):  # and the session goes on from it
        pass
    assert not (await api.get_state(sid)).inbox


def test_format_1_bodies_decode_with_the_defaults_of_later_fields() -> None:
    from turnlog.engine import ChatMessage

    state = SessionState("s", 9, "a", "u", messages=[ChatMessage("user", "hi", ref=3)])
    state.turn = TurnProgress("t", "m", 2, iterations=1)
    back = snapshots.decode_state(as_format_1(snapshots.encode_state(state)), 1, where="old")
    assert back.turn == state.turn and back.messages == [ChatMessage.user("hi")]  # ref unknown: 0
    assert back.task_state == {} and back.archived == 0 and back.origin_calls == {}
    with pytest.raises(SnapshotFormatError, match="reads 1, 2, 3, 4, 5, 6"):
        snapshots.decode_state("{}", 7, where="new")


def test_format_5_tool_calls_decode_without_their_start_times() -> None:
    """Logs written before the crash rule read start times: a format-5 call row has 8 fields,
    and its calls get no start times (a call found started then is timed from 0: its window
    has passed, and it is paced from its latest start, which is long past)."""
    from turnlog.engine import ChatMessage

    state = SessionState("s", 9, "a", "u", messages=[ChatMessage("user", "hi", ref=3)])
    state.turn = TurnProgress("t", "m", 2, iterations=1)
    state.turn.tool_calls = {"c1": ToolCallProgress("c1", "book", "{}", "started", 2, 1, "", "", 1000, 2000)}
    doc = json.loads(snapshots.encode_state(state))
    doc["t"][-1] = [row[:8] for row in doc["t"][-1]]
    back = snapshots.decode_state(json.dumps(doc), 5, where="old")
    (call,) = back.turn.tool_calls.values()  # type: ignore[union-attr]
    assert (call.status, call.attempts, call.first_started_ms, call.last_started_ms) == ("started", 2, 0, 0)
    with pytest.raises(SnapshotFormatError, match="corrupt snapshot"):
        snapshots.decode_state(json.dumps(doc), 6, where="new")


def test_format_4_deltas_with_their_whole_turn_history_still_decode() -> None:
    """Logs written before chained turn histories: a format-4 delta repeats its turn's history."""
    from turnlog.engine import ChatMessage
    from turnlog.engine.tools.guards import CallRecord

    state = SessionState("s", 9, "a", "u", messages=[ChatMessage("user", "hi", ref=3)])
    state.turn = TurnProgress("t", "m", 2, history=[CallRecord("c1", "lookup", "{}", 1, "success", "ok")])
    keyframe = snapshots.decode_state(snapshots.encode_state(state), snapshots.FORMAT, where="k")
    state.messages.append(ChatMessage("tool", "ok", tool_call_id="c1", name="lookup", ref=5))
    doc = json.loads(snapshots.encode_state(state, base=7, skip=1, previous=7))
    del doc["h"]  # what format 4 wrote: no "h", the turn's every record
    back = snapshots.decode_state(json.dumps(doc), 4, where="d", base=keyframe.messages, base_version=7)
    assert back == state


def as_format_3(text: str) -> str:
    """A text of this format (``"h"`` 0) as format 3 wrote it: no ``"p"`` or ``"h"`` (a delta
    then held every message since its keyframe; the caller gives it those)."""
    doc = json.loads(text)
    del doc["p"], doc["h"]
    return json.dumps(doc)


async def test_format_3_deltas_on_their_keyframe_still_load(log: SqliteEventLog) -> None:
    """Logs written before chained deltas: a format-3 delta carries every message since its
    keyframe and builds on the keyframe alone."""
    api, sid = await long_session(log, 6)
    at_keyframe = fold(sid, await log.read_session(sid))
    keyframe = ev.SnapshotTaken(
        session_id=sid, version=at_keyframe.version + 1, state_format=3, status=str(at_keyframe.status),
        last_tool="", turns=at_keyframe.turns_finished, input_tokens=0, output_tokens=0,
        message_count=len(at_keyframe.messages), keyframe_version=0,
        state_json=as_format_3(snapshots.encode_state(at_keyframe)),
    )  # fmt: skip
    await log.append([keyframe], expected_version=at_keyframe.version)
    for turn in range(3):
        async for _ in api.send_user_message(sid, f"more {turn}"):
            pass
    events = await log.read_session(sid)
    state = fold(sid, events)
    count = len(at_keyframe.messages)
    text = snapshots.encode_state(state, base=keyframe.version, skip=count)
    delta = dataclasses.replace(
        keyframe, version=state.version + 1, keyframe_version=keyframe.version,
        message_count=len(state.messages), state_json=as_format_3(text), event_id=ev.new_id(),
    )  # fmt: skip
    await log.append([delta], expected_version=state.version)
    assert await snapshots.chain_of(log, delta) == [keyframe]
    assert await snapshots.load_latest(log, sid) == state
