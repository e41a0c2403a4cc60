"""Steering sessions over real HTTP (uvicorn on a loopback port, the gateway's own TurnWorker):
cancel and interrupt a running turn, approve / edit / reject a paused tool call, and the admin's
snapshots, fork and replay. Every answer is checked against the log and the projections."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from tests.gateway_support import (
    RunningGateway,
    SseMessage,
    auth,
    create,
    open_log,
    read_until,
    serve_gateway,
    sse_messages,
    turn_committed,
)
from turnlog.engine import events as ev

TIMEOUT = httpx.Timeout(30.0)


@pytest.fixture
def running(tmp_path: Path):  # type: ignore[no-untyped-def]
    with serve_gateway(tmp_path) as gw:
        yield gw


async def log_events(running: RunningGateway, sid: str) -> list[ev.Event]:
    log = open_log(running.log_path)
    try:
        return await log.read_session(sid)
    finally:
        await log.close()


async def session_when(
    client: httpx.AsyncClient, sid: str, ready: Callable[[dict[str, Any]], bool], user: str = "alice"
) -> dict[str, Any]:
    """GET the session until ``ready`` holds (the worker runs turns in the background)."""
    for _ in range(600):
        session: dict[str, Any] = (await client.get(f"/v1/sessions/{sid}", headers=auth(user))).json()
        if ready(session):
            return session
        await asyncio.sleep(0.05)
    raise AssertionError(f"the session never got there; last seen: {session}")


def settled(state: str) -> Callable[[dict[str, Any]], bool]:
    return lambda s: s["current_state"] == state and not s["turn_running"]


async def test_cancel_stops_the_running_turn_and_the_stream_shows_it(running: RunningGateway) -> None:
    running.model.gate.clear()  # the answer stops half-way: the turn is running
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        seen: list[SseMessage] = []
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            stream = sse_messages(response)
            await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": "Where is A-17?"}, headers=auth("alice")
            )
            await read_until(stream, lambda m: m.event == "delta", seen)
            assert (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).json()["turn_running"]

            cancelled = await client.post(
                f"/v1/sessions/{sid}/cancel", json={"reason": "changed my mind"}, headers=auth("alice")
            )
            assert cancelled.status_code == 202, cancelled.text
            (written,) = cancelled.json()["events"]
            assert (written["type"], written["actor"], written["reason"]) == (
                "CancelRequested",
                "alice",
                "changed my mind",
            )
            running.model.gate.set()  # the model finishes its answer; the turn meets the cancel
            await read_until(stream, turn_committed(seen), seen)

        finished = next(m for m in seen if m.event == "TurnFinished")
        assert finished.json["reason"] == "cancelled"
        to_cancelled = [
            m.json for m in seen if m.event == "StateChanged" and m.json["to_state"] == "CANCELLED"
        ]
        assert [(c["cause"], c["detail"]) for c in to_cancelled] == [
            ("interrupt", "cancelled by alice: changed my mind")
        ]
        assert next(m for m in seen if m.event == "CancelRequested").id == written["position"]

        session = await session_when(client, sid, settled("CANCELLED"))
        assert session["pending_approvals"] == []
        again = await client.post(f"/v1/sessions/{sid}/cancel", json={}, headers=auth("alice"))
        assert again.status_code == 409 and again.json()["error"] == "no_turn_running"
        assert "nothing to cancel" in again.json()["detail"]

    events = await log_events(running, sid)
    # the answer decided before the cancel was never appended; the model call is recorded cancelled
    assert not [e for e in events if isinstance(e, ev.AssistantMessage) and e.text]
    (last_call,) = [e for e in events if isinstance(e, ev.ModelCallFinished) and e.step == 1]
    assert last_call.status == "cancelled"
    assert [e.type for e in events][-3:] == ["StateChanged", "TurnFinished", "SnapshotTaken"]
    streamed = [m.id for m in seen if m.id is not None]
    assert streamed == sorted(streamed) and len(streamed) == len(events)

    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        await client.post(f"/v1/admin/sessions/{sid}/finish", json={}, headers=auth("root"))
        for route, body in (("cancel", {}), ("interrupt", {"text": "hello?"})):
            closed = await client.post(f"/v1/sessions/{sid}/{route}", json=body, headers=auth("alice"))
            assert (closed.status_code, closed.json()["error"]) == (409, "session_closed"), route


async def test_interrupt_stops_the_turn_and_its_message_starts_the_next(running: RunningGateway) -> None:
    running.model.gate.clear()
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            stream = sse_messages(response)
            await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": "Where is A-17?"}, headers=auth("alice")
            )
            await read_until(stream, lambda m: m.event == "delta", [])
            blank = await client.post(
                f"/v1/sessions/{sid}/interrupt", json={"text": " "}, headers=auth("alice")
            )
            assert blank.status_code == 422  # a message that would be refused stops nothing
            interrupted = await client.post(
                f"/v1/sessions/{sid}/interrupt", json={"text": "Actually: order B-9?"}, headers=auth("alice")
            )
            assert interrupted.status_code == 202, interrupted.text
            body = interrupted.json()
            assert body["interrupted"] is True
            assert [e["type"] for e in body["events"]] == ["CancelRequested", "UserMessageReceived"]
            running.model.gate.set()
            seen: list[SseMessage] = []
            await read_until(stream, lambda m: sum(x.event == "TurnFinished" for x in seen) == 2, seen)

        assert [m.json["reason"] for m in seen if m.event == "TurnFinished"] == ["cancelled", "answered"]
        await session_when(client, sid, settled("FINISHED"))
        # with no turn running, an interrupt is a plain message
        plain = await client.post(
            f"/v1/sessions/{sid}/interrupt", json={"text": "thanks"}, headers=auth("alice")
        )
        assert plain.status_code == 202 and plain.json()["interrupted"] is False
        assert [e["type"] for e in plain.json()["events"]] == ["UserMessageReceived"]
        await session_when(client, sid, lambda s: s["turns"] == 3 and not s["turn_running"])

    events = await log_events(running, sid)
    assert sum(isinstance(e, ev.CancelRequested) for e in events) == 1
    # the turn of the interrupting message saw the interrupted one in its history
    second_turn = running.model.requests[3]
    users = [m.content for m in second_turn.messages if m.role == "user"]
    assert users == ["Where is A-17?", "Actually: order B-9?"]


async def test_approve_edit_and_reject_a_paused_call(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client, agent="refunds"))["session_id"]
        url = f"/v1/sessions/{sid}/approvals"

        async def pause(text: str) -> str:
            await client.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=auth("alice"))
            session = await session_when(client, sid, lambda s: s["current_state"] == "PAUSED_FOR_USER")
            (waiting,) = session["pending_approvals"]
            assert waiting["tool_name"] == "refund" and waiting["arguments"] == {
                "order_id": "A-17",
                "amount": 40,
            }
            return str(waiting["call_id"])

        # edit: the tool runs with the edited arguments
        call_id = await pause("Refund A-17 please")
        version = (await log_events(running, sid))[-1].version
        bad_edit = {"decision": "edit", "arguments": {"amount": "x", "order_id": "A"}}
        refusals = [
            ("nope", {"decision": "approve"}, 404, "unknown_call"),
            (call_id, {"decision": "maybe"}, 422, "invalid_input"),
            (call_id, {"decision": "edit"}, 422, "invalid_input"),
            (call_id, {"decision": "approve", "arguments": {"amount": 1}}, 422, "invalid_input"),
            (call_id, bad_edit, 422, "invalid_arguments"),
        ]  # fmt: skip
        for target, body, status, code in refusals:
            refused = await client.post(f"{url}/{target}", json=body, headers=auth("alice"))
            assert (refused.status_code, refused.json()["error"]) == (status, code), (body, refused.text)
        assert "amount must be an integer" in refused.json()["detail"]  # names the field
        unknown = await client.post(f"{url}/nope", json={"decision": "approve"}, headers=auth("alice"))
        assert f"waiting: {call_id} (refund)" in unknown.json()["detail"]
        assert (await log_events(running, sid))[-1].version == version  # nothing refused was written

        edited = await client.post(
            f"{url}/{call_id}",
            json={"decision": "edit", "arguments": {"order_id": "A-17", "amount": 25}, "note": "half"},
            headers=auth("alice"),
        )
        assert edited.status_code == 202, edited.text
        decided, resumed = edited.json()["events"]
        assert (decided["type"], decided["decision"], decided["actor"], decided["note"]) == (
            "ApprovalDecided", "edited", "alice", "half",
        )  # fmt: skip
        assert decided["arguments_json"] == '{"order_id": "A-17", "amount": 25}'
        assert (resumed["type"], resumed["from_state"], resumed["to_state"]) == (
            "StateChanged", "PAUSED_FOR_USER", "TOOL_WAIT",
        )  # fmt: skip
        assert decided["position"] < resumed["position"]
        await session_when(client, sid, settled("FINISHED"))
        assert running.refunds == [{"order_id": "A-17", "amount": 25}]

        async def decided_again(call_id: str, decision: str) -> None:
            """A second decision on a decided call is a conflict naming the first, whatever it was
            and whether or not its turn is still running."""
            for again in ("approve", "reject"):
                late = await client.post(f"{url}/{call_id}", json={"decision": again}, headers=auth("alice"))
                assert (late.status_code, late.json()["error"]) == (409, "not_awaiting_approval"), late.text
                assert (
                    f"tool call '{call_id}' (refund) was already decided: {decision} by alice"
                    in (late.json()["detail"])
                )

        await decided_again(call_id, "edited")

        # reject: the tool never runs; the model is told it was declined
        call_id = await pause("Another refund")
        rejected = await client.post(
            f"{url}/{call_id}", json={"decision": "reject", "note": "too much"}, headers=auth("alice")
        )
        assert rejected.status_code == 202
        assert rejected.json()["events"][0]["decision"] == "rejected"
        await session_when(client, sid, settled("FINISHED"))
        await decided_again(call_id, "rejected")
        assert running.refunds == [{"order_id": "A-17", "amount": 25}]

        # approve: the tool runs as the model asked
        call_id = await pause("One more")
        approved = await client.post(f"{url}/{call_id}", json={"decision": "approve"}, headers=auth("bob"))
        assert approved.status_code == 404  # not bob's session
        approved = await client.post(f"{url}/{call_id}", json={"decision": "approve"}, headers=auth("alice"))
        assert approved.status_code == 202
        await decided_again(call_id, "approved")  # while its turn may still run
        await session_when(client, sid, settled("FINISHED"))
        await decided_again(call_id, "approved")
        assert running.refunds == [{"order_id": "A-17", "amount": 25}, {"order_id": "A-17", "amount": 40}]

        timeline = (await client.get(f"/v1/sessions/{sid}/timeline", headers=auth("alice"))).json()
        rows = sorted(timeline["tool_calls"], key=lambda c: c["version"])
        assert [(c["approval"], c["status"]) for c in rows] == [
            ("edited", "success"), ("rejected", "declined"), ("approved", "success"),
        ]  # fmt: skip
        assert '"amount": 25' in rows[0]["approved_json"]
        kinds = [e["type"] for e in timeline["events"]]
        assert kinds.count("ApprovalRequested") == 3 and kinds.count("ApprovalDecided") == 3

    events = await log_events(running, sid)
    answers = [
        e.text for e in events if isinstance(e, ev.AssistantMessage) and e.text.startswith("refund result")
    ]
    assert "DECLINED" in answers[1] and "too much" in answers[1]
    started = [e for e in events if isinstance(e, ev.ToolCallStarted)]
    assert len(started) == 2  # the rejected call never started


async def test_two_decisions_at_once_one_is_taken_the_other_is_a_conflict(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client, agent="refunds"))["session_id"]
        await client.post(f"/v1/sessions/{sid}/messages", json={"text": "Refund A-17"}, headers=auth("alice"))
        session = await session_when(client, sid, lambda s: s["current_state"] == "PAUSED_FOR_USER")
        call_id = session["pending_approvals"][0]["call_id"]
        url = f"/v1/sessions/{sid}/approvals/{call_id}"
        answers = await asyncio.gather(
            *(client.post(url, json={"decision": d}, headers=auth("alice")) for d in ("approve", "reject"))
        )
        assert sorted(a.status_code for a in answers) == [202, 409], [a.text for a in answers]
        taken = next(a for a in answers if a.status_code == 202).json()["events"][0]["decision"]
        refused = next(a for a in answers if a.status_code == 409).json()
        assert refused["error"] == "not_awaiting_approval"
        assert f"'{call_id}' (refund) was already decided: {taken}" in refused["detail"]
        await session_when(client, sid, settled("FINISHED"))
    decisions = [e.decision for e in await log_events(running, sid) if isinstance(e, ev.ApprovalDecided)]
    assert decisions == [taken]


async def test_fork_a_snapshot_continue_the_fork_and_replay(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        await client.post(
            f"/v1/sessions/{sid}/messages", json={"text": "Where is A-17?"}, headers=auth("alice")
        )
        await session_when(client, sid, settled("FINISHED"))
        admin_url = f"/v1/admin/sessions/{sid}"
        assert (await client.get(f"{admin_url}/snapshots", headers=auth("alice"))).status_code == 403

        snapshots = (await client.get(f"{admin_url}/snapshots", headers=auth("root"))).json()["snapshots"]
        events = await log_events(running, sid)
        assert [s["version"] for s in snapshots] == [
            e.version for e in events if isinstance(e, ev.SnapshotTaken)
        ]
        mid, end = snapshots  # after the tool step (before the answer), and at the turn end
        assert (mid["status"], mid["last_tool"], end["status"], end["turns"]) == (
            "PROCESSING",
            "lookup",
            "FINISHED",
            1,
        )

        missing = await client.post(f"{admin_url}/fork", json={"version": 2}, headers=auth("root"))
        assert missing.status_code == 404 and missing.json()["error"] == "snapshot_not_found"
        assert f"versions {mid['version']}, {end['version']}" in missing.json()["detail"]
        nobody = await client.post(
            f"{admin_url}/fork", json={"version": end["version"], "agent": "x"}, headers=auth("root")
        )
        assert nobody.status_code == 422 and nobody.json()["error"] == "unknown_agent"

        forked = await client.post(
            f"{admin_url}/fork", json={"version": end["version"]}, headers=auth("root")
        )
        assert forked.status_code == 201, forked.text
        fork = forked.json()
        assert (fork["type"], fork["origin_session_id"], fork["origin_version"]) == (
            "SessionForked",
            sid,
            end["version"],
        )
        assert (fork["user_id"], fork["status"], fork["turn_running"], fork["version"]) == (
            "alice",
            "FINISHED",
            False,
            1,
        )
        fid = fork["session_id"]
        assert fid != sid and "state_json" not in fork and fork["state_json_chars"] > 0

        # the fork is alice's to continue; its turn sees the origin's history
        assert (await client.get(f"/v1/sessions/{fid}", headers=auth("bob"))).status_code == 404
        await client.post(f"/v1/sessions/{fid}/messages", json={"text": "And B-9?"}, headers=auth("alice"))
        session = await session_when(client, fid, lambda s: s["turns"] == 2 and not s["turn_running"])
        assert session["current_state"] == "FINISHED"
        users = [m.content for m in running.model.requests[-1].messages if m.role == "user"]
        assert users == ["Where is A-17?", "And B-9?"]
        assert (await log_events(running, sid)) == events  # the origin was not touched

        # a fork from the mid-turn snapshot, with another agent, inherits the running turn
        choose = await client.post(
            f"{admin_url}/fork", json={"version": mid["version"], "agent": "troubled"}, headers=auth("root")
        )
        assert choose.status_code == 422 and "unfinished='continue'" in choose.json()["detail"]
        other = await client.post(
            f"{admin_url}/fork",
            json={"version": mid["version"], "agent": "troubled", "unfinished": "continue"},
            headers=auth("root"),
        )
        assert other.status_code == 201, other.text
        assert (other.json()["agent_id"], other.json()["model"], other.json()["turn_running"]) == (
            "troubled", "primary", True,
        )  # fmt: skip

        # replay, page by page: every event with the state folded up to it
        steps: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            page = await client.get(f"{admin_url}/replay?after_version={after}&limit=4", headers=auth("root"))
            assert page.status_code == 200, page.text
            steps += page.json()["steps"]
            after = page.json()["next_after_version"]
        assert [(s["event"]["type"], s["event"]["version"]) for s in steps] == [
            (e.type, e.version) for e in events
        ]
        assert all(s["state"]["version"] == s["event"]["version"] for s in steps)
        by_type = {s["event"]["type"]: s["state"] for s in steps}
        assert by_type["SessionCreated"]["status"] == "IDLE"
        assert by_type["ToolCallStarted"]["status"] == "TOOL_WAIT"
        assert (steps[-1]["state"]["status"], steps[-1]["state"]["turns_finished"]) == ("FINISHED", 1)
        assert steps[-1]["event"]["type"] == "SnapshotTaken" and "state_json" not in steps[-1]["event"]
        assert (await client.get(f"{admin_url}/replay", headers=auth("alice"))).status_code == 403
