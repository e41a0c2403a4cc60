"""The isolation walk: every route as the owner, as another user, as an admin, unauthenticated
and with a wrong key, over real HTTP. Another user's session gets exactly the answer a missing
one gets."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.gateway_support import KEYS, auth, open_log, serve_gateway
from turnlog.engine import events as ev

TIMEOUT = httpx.Timeout(30.0)
MISSING = "0" * 32


@dataclass(frozen=True)
class Setup:
    """What a fresh session of alice's has done before the route is called."""

    sid: str
    turn_id: str = ""
    call_id: str = ""
    snapshot: int = 0
    experiment_id: str = ""


@dataclass(frozen=True)
class RouteCase:
    method: str
    path: str
    scope: str
    """owner: a session's route; user: any authenticated key; admin: admin keys only."""
    body: dict[str, Any] | Callable[[Setup], dict[str, Any]] | None = None
    needs: str = "idle"
    """The session's state for the call: idle, answered (one turn done), paused (a call waits),
    budget (the turn waits on its cost budget)."""


ROUTES = [
    RouteCase("POST", "/v1/sessions", "user", {"agent": "support"}),
    RouteCase("GET", "/v1/sessions", "user"),
    RouteCase("GET", "/openapi.json", "user"),
    RouteCase("GET", "/viewer", "public"),
    RouteCase("GET", "/healthz", "public"),
    RouteCase("GET", "/readyz", "public"),
    RouteCase("GET", "/v1/sessions/{session_id}", "owner"),
    RouteCase("GET", "/v1/sessions/{session_id}/history", "owner"),
    RouteCase("GET", "/v1/sessions/{session_id}/timeline", "owner"),
    RouteCase("GET", "/v1/sessions/{session_id}/model_calls/{turn_id}/{step}", "owner", needs="answered"),
    RouteCase("POST", "/v1/sessions/{session_id}/messages", "owner", {"text": "Where is order A-17?"}),
    RouteCase("GET", "/v1/sessions/{session_id}/events", "owner"),
    RouteCase("POST", "/v1/sessions/{session_id}/cancel", "owner", {"reason": "walk"}, needs="paused"),
    RouteCase("POST", "/v1/sessions/{session_id}/interrupt", "owner", {"text": "stop that"}, needs="paused"),
    RouteCase(
        "POST",
        "/v1/sessions/{session_id}/approvals/{call_id}",
        "owner",
        {"decision": "reject"},
        needs="paused",
    ),
    RouteCase(
        "POST",
        "/v1/sessions/{session_id}/budget",
        "owner",
        {"decision": "raise", "extra_micros": 5000},
        needs="budget",
    ),
    RouteCase(
        "POST",
        "/v1/agui/{agent}",
        "user",
        {
            "threadId": "t-1",
            "runId": "r-1",
            "state": {},
            "tools": [],
            "context": [],
            "forwardedProps": {},
            "messages": [{"id": "m-1", "role": "user", "content": "Where is order A-17?"}],
        },
    ),  # fmt: skip
    RouteCase("GET", "/v1/admin/sessions", "admin"),
    RouteCase("GET", "/v1/admin/analytics/daily", "admin"),
    RouteCase("GET", "/metrics", "admin"),
    RouteCase("POST", "/v1/admin/sessions/{session_id}/finish", "admin-owner", {"reason": "walk"}),
    RouteCase("GET", "/v1/admin/sessions/{session_id}/snapshots", "admin-owner", needs="answered"),
    RouteCase(
        "POST",
        "/v1/admin/sessions/{session_id}/fork",
        "admin-owner",
        lambda done: {"version": done.snapshot},
        needs="answered",
    ),
    RouteCase("GET", "/v1/admin/sessions/{session_id}/replay", "admin-owner"),
    RouteCase("GET", "/v1/admin/experiments", "admin"),
    RouteCase(
        "POST",
        "/v1/admin/experiments",
        "admin",
        lambda done: {"agent": "support", "select": {"session_ids": [done.sid]}},
    ),
    RouteCase("GET", "/v1/admin/experiments/{experiment_id}", "admin", needs="experiment"),
    RouteCase("POST", "/v1/admin/experiments/{experiment_id}/resume", "admin", needs="experiment"),
    RouteCase("DELETE", "/v1/admin/sessions/{session_id}", "admin-owner"),
    RouteCase("DELETE", "/v1/admin/users/{user_id}", "admin"),  # last: erases alice's sessions
]
CALLERS = {
    "owner": auth("alice"),
    "other": auth("bob"),
    "admin": auth("root"),
    "anonymous": {},
    "wrong key": {"Authorization": "Bearer " + KEYS["alice"] + "x"},
}


async def call(
    client: httpx.AsyncClient, case: RouteCase, done: Setup, headers: dict[str, str]
) -> tuple[int, Any]:
    """Status and body; an event stream is opened, its status read, and closed."""
    url = case.path.format(
        session_id=done.sid,
        agent="support",
        turn_id=done.turn_id,
        step=0,
        call_id=done.call_id,
        experiment_id=done.experiment_id,
        user_id="alice",
    )
    body = case.body(done) if callable(case.body) else case.body
    async with client.stream(case.method, url, json=body, headers=headers) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response.status_code, None
        await response.aread()
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.status_code, response.json()
        return response.status_code, response.text


async def prepare(client: httpx.AsyncClient, needs: str) -> Setup:
    """A fresh session of alice's (so a force-finish or a cancel cannot change later answers),
    brought to what the route needs: a finished turn, or a turn paused for an approval."""
    agent = {"paused": "refunds", "budget": "metered"}.get(needs, "support")
    created = await client.post("/v1/sessions", json={"agent": agent}, headers=auth("alice"))
    sid = created.json()["session_id"]
    if needs == "idle":
        return Setup(sid)
    if needs == "experiment":  # an experiment (of this idle session: nothing to replay) to read or resume
        body = {"agent": "support", "select": {"session_ids": [sid]}}
        started = await client.post("/v1/admin/experiments", json=body, headers=auth("root"))
        return Setup(sid, experiment_id=started.json()["experiment_id"])
    await client.post(f"/v1/sessions/{sid}/messages", json={"text": "Where is A-17?"}, headers=auth("alice"))
    for _ in range(600):
        timeline = (await client.get(f"/v1/sessions/{sid}/timeline", headers=auth("alice"))).json()
        turns, waiting = timeline["turns"], timeline["session"]["current_state"] == "PAUSED_FOR_USER"
        if needs == "answered" and turns and turns[0]["outcome"]:
            snapshot = max(e["version"] for e in timeline["events"] if e["type"] == "SnapshotTaken")
            return Setup(sid, turn_id=str(turns[0]["turn_id"]), snapshot=snapshot)
        if needs == "budget" and waiting:
            return Setup(sid)
        if needs == "paused" and waiting:
            (call,) = [c for c in timeline["tool_calls"] if c["approval"] == "pending"]
            return Setup(sid, call_id=str(call["call_id"]))
        await asyncio.sleep(0.05)
    raise AssertionError(f"the session did not get to {needs!r}")


def expected_status(case: RouteCase, caller: str) -> int | str:
    if case.scope == "public":  # static page code, health: no data
        return "2xx"
    if caller in ("anonymous", "wrong key"):
        return 401
    if case.scope == "user":
        return "2xx"
    if case.scope in ("admin", "admin-owner"):
        return "2xx" if caller == "admin" else 403
    return 404 if caller == "other" else "2xx"


async def test_every_route_as_owner_other_user_admin_and_unauthenticated(tmp_path: Path) -> None:
    walked = []
    with serve_gateway(tmp_path) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=TIMEOUT) as client:
            for case in ROUTES:
                for caller, headers in CALLERS.items():
                    done = await prepare(client, case.needs)
                    sid = done.sid
                    status, body = await call(client, case, done, headers)
                    want = expected_status(case, caller)
                    ok = 200 <= status < 300 if want == "2xx" else status == want
                    assert ok, f"{case.method} {case.path} as {caller}: {status} {body}, expected {want}"
                    if want == 401:
                        assert body["error"] == "unauthenticated"
                    if want == 404:
                        missing = Setup(MISSING, done.turn_id, done.call_id, done.snapshot)
                        missing_status, missing_body = await call(client, case, missing, headers)
                        assert (status, body) == (
                            missing_status,
                            {**missing_body, "detail": f"no session {sid}"},
                        )
                        assert body == {"error": "not_found", "detail": f"no session {sid}"}
                    walked.append((case.path, case.method, caller))
            assert len(walked) == len(ROUTES) * len(CALLERS)
            assert {r.path for r in ROUTES} == {r.path for r in running.gateway.app().routes}  # type: ignore[attr-defined]

            # bob never sees alice's sessions in a list; the admin sees them all
            bobs = (await client.get("/v1/sessions?limit=500", headers=auth("bob"))).json()["sessions"]
            assert {s["user_id"] for s in bobs} <= {"bob"}
            everyone = (await client.get("/v1/admin/sessions?limit=500", headers=auth("root"))).json()[
                "sessions"
            ]
            assert "alice" in {s["user_id"] for s in everyone}

    log = open_log(running.log_path)
    try:
        owners: dict[str, str] = {}
        writers: dict[str, set[str]] = {}
        actors: set[tuple[str, str]] = set()
        for partition in range(log.partitions):
            for record in await log.read_partition(partition, 0, 100_000):
                event = record.event
                if isinstance(event, ev.SessionCreated):
                    owners[event.session_id] = event.user_id
                elif isinstance(event, ev.UserMessageReceived):
                    writers.setdefault(event.session_id, set()).add(event.user_id)
                elif isinstance(event, (ev.CancelRequested, ev.ApprovalDecided)):
                    actors.add((event.type, event.actor))
        # only a session's owner ever wrote into it (bob's and anonymous posts wrote nothing)
        assert writers and all(users == {owners[sid]} for sid, users in writers.items())
        assert {owners[sid] for sid in writers} == {"alice", "bob", "root"}  # AG-UI threads are per user
        # cancels and decisions came from the owner or an admin, never from bob
        assert actors == {
            ("CancelRequested", "alice"), ("CancelRequested", "admin"),
            ("ApprovalDecided", "alice"), ("ApprovalDecided", "root"),
        }  # fmt: skip
    finally:
        await log.close()
