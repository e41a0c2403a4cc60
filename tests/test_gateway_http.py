"""The gateway end to end over real HTTP: uvicorn on a loopback port, a real httpx client.

Post a message, stream the turn, disconnect mid-turn, reconnect with Last-Event-ID, and compare
everything streamed with the log; force-finish; the OpenAPI document; the limits.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from sse_starlette import ServerSentEvent

from tests.gateway_support import (
    AGENTS,
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
from turnlog.engine.log.base import LogRecord
from turnlog.engine.stream import ModelDelta
from turnlog.gateway import Limits
from turnlog.gateway.openapi import document
from turnlog.gateway.stream import delta_message, event_message

TIMEOUT = httpx.Timeout(30.0)


@pytest.fixture
def running(tmp_path: Path):  # type: ignore[no-untyped-def]
    with serve_gateway(tmp_path) as gw:
        yield gw


async def test_post_stream_disconnect_mid_turn_and_resume_with_last_event_id(running: RunningGateway) -> None:
    running.model.gate.clear()  # the answer stops half-way until the test opens the gate
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        session = await create(client)
        sid = session["session_id"]
        first: list[SseMessage] = []
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            stream = sse_messages(response)
            created = await read_until(stream, lambda m: m.event == "SessionCreated", first)
            assert created.id == session["position"]

            posted = await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": "Where is order A-17?"}, headers=auth("alice")
            )
            assert posted.status_code == 202, posted.text
            await read_until(stream, lambda m: m.event == "delta", first)
            # the turn is now mid-stream (the model waits on its gate): disconnect here
        last_id = max(m.id for m in first if m.id is not None)

        running.model.gate.set()
        second: list[SseMessage] = []
        headers = {**auth("alice"), "Last-Event-ID": str(last_id)}
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=headers) as response:
            assert response.status_code == 200
            await read_until(sse_messages(response), turn_committed(second), second)

    log = open_log(running.log_path)
    try:
        records = await log.read_session_records(sid)
    finally:
        await log.close()
    streamed = [m for m in first + second if m.id is not None]
    # nothing missed, nothing twice, in log order, ids are log positions
    assert [m.id for m in streamed] == [r.offset for r in records]
    assert [m.event for m in streamed] == [r.event.type for r in records]
    assert [m.json["version"] for m in streamed] == [r.event.version for r in records]
    message = next(r.event for r in records if isinstance(r.event, ev.UserMessageReceived))
    assert posted.json()["position"] == next(r.offset for r in records if r.event is message)
    assert message.text == "Where is order A-17?" and message.user_id == "alice"

    # the first connection got the first half of the answer live, before the model call ended
    deltas = [m.json["text"] for m in first if m.event == "delta"]
    assert "".join(deltas) == running.model.first_half
    assert "ModelCallFinished" not in [m.event for m in first if m.json.get("step") == 1]
    last_model_event = [m for m in first if m.event in ("ModelCallStarted", "ModelCallFinished")][-1]
    assert last_model_event.event == "ModelCallStarted" and last_model_event.json["step"] == 1
    answer = next(r.event for r in records if isinstance(r.event, ev.AssistantMessage) and r.event.text)
    assert answer.text == running.model.first_half + running.model.second_half

    snapshots = [m.json for m in streamed if m.event == "SnapshotTaken"]  # the version, not the state
    assert snapshots and all("state_json" not in m and m["state_json_chars"] > 100 for m in snapshots)
    phases = [m.json.get("phase") for m in streamed if m.json.get("phase")]
    assert phases == [
        "turn.start", "model.start", "model.end", "tool.start", "tool.end",
        "model.start", "model.end", "turn.end",
    ]  # fmt: skip


async def test_reads_come_from_the_projections(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": "Status of A-17?"}, headers=auth("alice")
            )
            await read_until(sse_messages(response), lambda m: m.event == "TurnFinished", [])

        session = (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).json()
        assert session["user_id"] == "alice" and session["current_state"] == "FINISHED"
        assert session["turns"] == 1 and session["closed"] is False

        history = (await client.get(f"/v1/sessions/{sid}/history?limit=2", headers=auth("alice"))).json()
        assert [m["role"] for m in history["messages"]] == ["tool", "assistant"]
        assert history["messages"][-1]["content"] == running.model.first_half + running.model.second_half

        timeline = (await client.get(f"/v1/sessions/{sid}/timeline", headers=auth("alice"))).json()
        assert [(c["step"], c["status"]) for c in timeline["model_calls"]] == [(0, "ok"), (1, "ok")]
        assert [(t["tool_name"], t["status"], t["input_json"]) for t in timeline["tool_calls"]] == [
            ("lookup", "success", '{"order_id": "A-17"}')
        ]
        assert [(c["to_state"], c["cause"]) for c in timeline["state_changes"]] == [
            ("PROCESSING", "user_message"), ("TOOL_WAIT", "model_tool_call"),
            ("PROCESSING", "tool_result"), ("FINISHED", "model_answer"),
        ]  # fmt: skip
        assert [t["outcome"] for t in timeline["turns"]] == ["answered"]
        turn_id = timeline["turns"][0]["turn_id"]
        for step, request in enumerate(running.model.requests):  # rebuilt exactly as the model got it
            url = f"/v1/sessions/{sid}/model_calls/{turn_id}/{step}"
            sent = (await client.get(url, headers=auth("alice"))).json()
            assert sent["exact"] is True and sent["message_count"] == len(request.messages)
            assert [(m["role"], m["content"]) for m in sent["messages"]] == [
                (m.role, m.content) for m in request.messages
            ]
        missing = await client.get(f"/v1/sessions/{sid}/model_calls/{turn_id}/9", headers=auth("alice"))
        assert missing.status_code == 404 and "no model call 9" in missing.json()["detail"]

        listed = (await client.get("/v1/sessions", headers=auth("alice"))).json()["sessions"]
        assert [s["session_id"] for s in listed] == [sid]
        assert (await client.get("/v1/sessions", headers=auth("bob"))).json()["sessions"] == []


async def test_force_finish_closes_the_session_and_streams_it(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            stream = sse_messages(response)
            await read_until(stream, lambda m: m.event == "SessionCreated", [])
            finished = await client.post(
                f"/v1/admin/sessions/{sid}/finish", json={"reason": "customer left"}, headers=auth("root")
            )
            assert finished.status_code == 200, finished.text
            assert finished.json()["closed"] is True and finished.json()["close_reason"] == "customer left"
            closed = await read_until(stream, lambda m: m.event == "SessionClosed", [])
            assert closed.json["actor"] == "root"

        late = await client.post(
            f"/v1/sessions/{sid}/messages", json={"text": "hello?"}, headers=auth("alice")
        )
        assert late.status_code == 409 and late.json()["error"] == "session_closed"
        again = await client.post(f"/v1/admin/sessions/{sid}/finish", json={}, headers=auth("root"))
        assert again.status_code == 409


async def test_a_correction_the_model_got_is_streamed_and_its_repeated_call_never_runs(
    running: RunningGateway,
) -> None:
    """The small agent's model repeats its lookup: the repeat is dropped, the model told so, and
    the ModelCorrected event reaches the stream with the rest of the turn."""
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client, agent="small"))["session_id"]
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            stream = sse_messages(response)
            await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": "Where is A-17?"}, headers=auth("alice")
            )
            seen: list[SseMessage] = []
            await read_until(stream, lambda m: m.event == "TurnFinished", seen)
    [correction] = [m.json for m in seen if m.event == "ModelCorrected"]
    assert (correction["kind"], correction["step"], correction["attempt"]) == ("repeated_call", 1, 1)
    assert correction["correction"].startswith("These calls were already made")
    assert '"lookup"' in correction["model_text"] and correction["dropped_calls_json"].startswith(
        '[{"name": "lookup"'
    )
    assert [m.json["tool_name"] for m in seen if m.event == "ToolCallStarted"] == ["lookup"]  # ran once
    assert [m.json["reason"] for m in seen if m.event == "TurnFinished"] == ["answered"]


async def test_bad_input_gets_a_specific_4xx_and_writes_nothing(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        url = f"/v1/sessions/{sid}/messages"
        cases = [
            (dict(content=b"{not json"), 400, "bad_json"),
            (dict(json={"text": 5}), 422, "invalid_input"),
            (dict(json={"text": "   "}), 422, "invalid_input"),
            (dict(json=["text"]), 422, "invalid_input"),
            (dict(json={"text": "x" * (70 * 1024)}), 413, "body_too_large"),
            (dict(json={"text": "hi", "message_id": 5}), 422, "invalid_input"),
            (dict(json={"text": "hi", "message_id": ""}), 422, "invalid_input"),
        ]
        for kwargs, status, code in cases:
            response = await client.post(url, headers=auth("alice"), **kwargs)  # type: ignore[arg-type]
            assert (response.status_code, response.json()["error"]) == (status, code), kwargs
        unknown = await client.post("/v1/sessions", json={"agent": "nope"}, headers=auth("alice"))
        assert unknown.status_code == 422
        known = "known agents: logistics-assistant, metered, refunds, small, support"
        assert known in unknown.json()["detail"]
        bad_id = await client.get(
            f"/v1/sessions/{sid}/events", headers={**auth("alice"), "Last-Event-ID": "x"}
        )
        assert bad_id.status_code == 400
    log = open_log(running.log_path)
    try:
        assert await log.session_version(sid) == 1  # only SessionCreated: nothing bad was written
    finally:
        await log.close()


async def test_a_post_retried_with_its_message_id_is_taken_once(running: RunningGateway) -> None:
    """A client that never saw the 202 posts again with the id it chose: the same message, the
    same log position, one turn."""
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        url, body = f"/v1/sessions/{sid}/messages", {"text": "Where is order A-17?", "message_id": "c-1"}
        first = await client.post(url, json=body, headers=auth("alice"))
        again = await client.post(url, json=body, headers=auth("alice"))
        assert first.status_code == again.status_code == 202, again.text
        assert again.json() == first.json() and first.json()["message_id"] == "c-1"
    log = open_log(running.log_path)
    try:
        for _ in range(600):  # the gateway's worker runs the turn
            events = await log.read_session(sid)
            if any(isinstance(e, ev.TurnFinished) for e in events):
                break
            await asyncio.sleep(0.05)
    finally:
        await log.close()
    assert [e.message_id for e in events if isinstance(e, ev.UserMessageReceived)] == ["c-1"]
    assert [e.message_id for e in events if isinstance(e, ev.TurnStarted)] == ["c-1"]


async def test_every_refusal_has_the_documented_shape_and_security_headers(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        answers = {
            "no route": await client.get("/v1/nope", headers=auth("alice")),
            "trailing slash": await client.get("/v1/sessions/"),  # a 404 before auth, not a redirect
            "method": await client.delete("/v1/sessions", headers=auth("alice")),
            "role": await client.post(
                "/v1/sessions", json={"agent": "support", "role": "boss"}, headers=auth("alice")
            ),
            "budget": await client.post(
                f"/v1/sessions/{sid}/budget", json={"decision": "stop"}, headers=auth("alice")
            ),
            "raise 0": await client.post(
                f"/v1/sessions/{sid}/budget", json={"decision": "raise"}, headers=auth("alice")
            ),
        }
        expected = {
            "no route": (404, "not_found", "no route GET /v1/nope"),
            "trailing slash": (404, "not_found", "no route GET /v1/sessions/"),
            "method": (405, "method_not_allowed", "/v1/sessions does not take DELETE"),
            "role": (422, "invalid_input", "'role' must be one of user, admin, not 'boss'"),
            "budget": (409, "not_awaiting_budget", "no turn is waiting for a budget decision"),
            "raise 0": (422, "invalid_input", "raising a budget needs 'extra_micros' > 0"),
        }
        for name, response in answers.items():
            status, code, detail = expected[name]
            assert response.headers["content-type"] == "application/json", name
            body = response.json()
            assert (response.status_code, set(body), body["error"]) == (status, {"error", "detail"}, code), (
                name
            )
            assert detail in body["detail"], (name, body)
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["x-frame-options"] == "DENY"
        assert set(answers["method"].headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}
        assert "location" not in answers["trailing slash"].headers


async def test_the_timeline_lists_turns_and_calls_in_the_order_they_happened(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            stream, seen = sse_messages(response), []
            for turn in range(5):  # turn ids are random: five in time order by chance is 1 in 120
                url = f"/v1/sessions/{sid}/messages"
                await client.post(url, json={"text": f"A-17, take {turn}"}, headers=auth("alice"))
                await read_until(stream, lambda m: m.event == "TurnFinished", seen)
                seen.clear()
        timeline = (await client.get(f"/v1/sessions/{sid}/timeline", headers=auth("alice"))).json()
    log = open_log(running.log_path)
    try:
        events = await log.read_session(sid)
    finally:
        await log.close()
    started = [e.turn_id for e in events if isinstance(e, ev.TurnStarted)]
    assert len(started) == 5 and [t["turn_id"] for t in timeline["turns"]] == started
    calls = [(e.turn_id, e.step) for e in events if isinstance(e, ev.ModelCallStarted)]
    assert [(m["turn_id"], m["step"]) for m in timeline["model_calls"]] == calls
    requested = [(e.turn_id, e.call_id) for e in events if isinstance(e, ev.ToolCallRequested)]
    assert [(c["turn_id"], c["call_id"]) for c in timeline["tool_calls"]] == requested


async def test_a_session_role_never_exceeds_the_key_role(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        denied = await client.post(
            "/v1/sessions", json={"agent": "support", "role": "admin"}, headers=auth("alice")
        )
        assert denied.status_code == 403
        assert (await create(client, "root", role="admin"))["role"] == "admin"
        assert (await create(client, "alice"))["role"] == "user"


async def test_rate_and_stream_limits_answer_429(tmp_path: Path) -> None:
    with serve_gateway(tmp_path, Limits(requests_per_second=0.001, burst=3, streams_per_user=1)) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
            sid = (await create(client))["session_id"]
            async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("bob")) as other:
                assert other.status_code == 404  # bob's requests count against bob only
            async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as one:
                assert one.status_code == 200
                second = await client.get(f"/v1/sessions/{sid}/events", headers=auth("alice"))
                assert second.status_code == 429 and second.json()["error"] == "too_many_streams"
            limited = await client.get("/v1/sessions", headers=auth("alice"))
            assert limited.status_code == 429 and limited.json()["error"] == "rate_limited"
            assert int(limited.headers["Retry-After"]) >= 1
            assert (await client.get("/v1/sessions", headers=auth("root"))).status_code == 200


async def test_a_closed_stream_frees_its_slot(tmp_path: Path) -> None:
    with serve_gateway(tmp_path, Limits(streams_per_user=1)) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
            sid = (await create(client))["session_id"]
            for _ in range(3):
                async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as r:
                    assert r.status_code == 200
                    await read_until(sse_messages(r), lambda m: m.event == "SessionCreated", [])
                for _ in range(200):  # the server notices the disconnect asynchronously
                    if running.gateway.streams.open_count("alice") == 0:
                        break
                    await asyncio.sleep(0.05)
                assert running.gateway.streams.open_count("alice") == 0


async def test_the_openapi_document_describes_every_route(running: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        served = (await client.get("/openapi.json", headers=auth("alice"))).json()
    assert served == document(AGENTS)
    routes = {
        (route.path, method.lower())
        for route in running.gateway.app().routes
        for method in (route.methods or ()) if method != "HEAD"  # type: ignore[attr-defined]
    }  # fmt: skip
    described = {(path, method) for path, ops in served["paths"].items() for method in ops}
    assert routes == described


async def test_metrics_and_analytics_routes_reflect_the_log(running: RunningGateway) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
        sid = (await create(client))["session_id"]
        await create(client)  # stays IDLE
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth("alice")) as response:
            await client.post(f"/v1/sessions/{sid}/messages", json={"text": "A-17?"}, headers=auth("alice"))
            await read_until(sse_messages(response), lambda m: m.event == "TurnFinished", [])

        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for _ in range(200):  # the consumers catch up asynchronously; wait until no group lags
            text = (await client.get("/metrics", headers=auth("root"))).text
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            lags = {k: v for k, v in samples.items() if k[0] == "turnlog_consumer_lag_records"}
            if lags and not any(lags.values()):
                break
            await asyncio.sleep(0.05)
        groups = {dict(k[1])["group"] for k in lags}
        assert groups == {"projector", "analytics", "observability", "turn-workers"}
        assert len(lags) == 4 * 4 and not any(lags.values())
        assert samples[("turnlog_active_sessions", (("state", "FINISHED"),))] == 1
        assert samples[("turnlog_active_sessions", (("state", "IDLE"),))] == 1
        assert samples[("turnlog_tool_calls_total", (("status", "success"), ("tool", "lookup")))] == 1
        assert samples[("turnlog_time_to_first_token_seconds_count", (("model", "gated"),))] == 1

        daily = (await client.get("/v1/admin/analytics/daily?days=1", headers=auth("root"))).json()
        assert daily["days"][0]["sessions"] == 2 and daily["days"][0]["turns"] == 1
        assert [t["tool_name"] for t in daily["tools"]] == ["lookup"]


async def test_turns_run_by_a_separate_worker_process_reach_the_stream(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    with serve_gateway(tmp_path, run_worker=False) as running:
        worker = subprocess.Popen(
            [sys.executable, str(repo / "tests" / "gateway_worker_proc.py"), str(running.log_path)],
            env={**os.environ, "PYTHONPATH": str(repo)},
        )
        try:
            async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
                sid = (await create(client))["session_id"]
                seen: list[SseMessage] = []
                async with client.stream(
                    "GET", f"/v1/sessions/{sid}/events", headers=auth("alice")
                ) as response:
                    stream = sse_messages(response)
                    await read_until(stream, lambda m: m.event == "SessionCreated", seen)
                    url = f"/v1/sessions/{sid}/messages"
                    assert (
                        await client.post(url, json={"text": "A-17?"}, headers=auth("alice"))
                    ).status_code == 202
                    await read_until(stream, turn_committed(seen), seen)
        finally:
            worker.kill()
            worker.wait(timeout=30)
    log = open_log(running.log_path)
    try:
        records = await log.read_session_records(sid)
    finally:
        await log.close()
    assert [m.id for m in seen] == [r.offset for r in records]  # found by the stream's log poll
    assert {r.event.producer for r in records if r.event.type == "TurnFinished"} == {"separate-worker"}
    assert not [m for m in seen if m.event == "delta"]  # deltas stay in the worker's process


def test_a_message_goes_on_the_wire_as_sse_starlette_writes_it_one_data_line() -> None:
    """The stream encodes its messages itself; what a client reads is unchanged: every line
    break or separator a user wrote stays inside the one ``data`` line (JSON escapes it)."""
    text = "line one\nline two\r\nthree\rfour \u2028 five \u0085 ü"
    message = ev.UserMessageReceived(session_id="s1", version=3, message_id="m1", user_id="alice", text=text)
    delta = ModelDelta("s1", "t1", 0, text)
    for streamed in (event_message(LogRecord(1, 42, message)), delta_message(delta)):
        wire = streamed.encode()
        id_ = None if streamed.id is None else str(streamed.id)
        assert wire == ServerSentEvent(data=streamed.data, event=streamed.event, id=id_).encode()
        lines = wire.decode().split("\r\n")
        assert lines[-2:] == ["", ""] and all("\n" not in line and "\r" not in line for line in lines)
        data = next(line for line in lines if line.startswith("data: "))
        assert json.loads(data[len("data: ") :])["text"] == text
