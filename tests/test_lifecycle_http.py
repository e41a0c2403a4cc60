"""Expiry over HTTP, on both backends: a real gateway (with its worker) on a loopback port, and a
lifecycle sweeper in the test process on the test's clock (on Kafka it owns no partition, so its
expiries go through the inbox to the gateway's worker). A message or an interrupt to an expired
session answers 409 ``session_expired`` saying when; an agent that continues in a new session
answers 202 with the new session's id; the timeline and the trace viewer show the expiry."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.backend_gateway import Stack, serve, stack, worker_on
from tests.gateway_support import KEYS, auth
from tests.lifecycle_support import IDLE, TestClock, agents
from turnlog.consumers.lifecycle import LifecycleSweeper
from turnlog.engine import AgentSessions, Lifecycle
from turnlog.engine import events as ev
from turnlog.engine.expiry import successor_id
from turnlog.projections.store import ProjectionStore

WAIT_S = 60.0
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def where(backend: str, tmp_path: Path) -> Iterator[Stack]:
    with stack(backend, tmp_path) as made:
        yield made


async def until_row(store: ProjectionStore, sid: str, holds: Any) -> dict[str, Any]:
    """The session's projection row once ``holds(row)`` (the gateway folds in its own thread)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            row = store.session(sid)
            if row is not None and holds(row):
                return row
            await asyncio.sleep(0.05)


async def test_expired_sessions_over_http(where: Stack) -> None:
    directory = agents(
        desk=Lifecycle(idle_expiry=IDLE), returning=Lifecycle(idle_expiry=IDLE, after_expiry="new_session")
    )
    store = where.store()
    try:
        with serve(where, directory) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                talked, silent, returning = await _sessions(client, store)
                expired_at = await _expire(where, store, [talked, silent, returning])
                await _refused(client, talked, expired_at)
                await _timeline(client, silent, expired_at)
                await _continued(client, store, returning)
            if Path(CHROMIUM).exists():
                await _viewer(url, talked, silent)
    finally:
        store.close()


async def _sessions(client: httpx.AsyncClient, store: ProjectionStore) -> list[str]:
    """alice's sessions: one answered, one never written to, one of the agent that continues."""
    sids = []
    for agent, text in (("desk", "hello"), ("desk", None), ("returning", "hello")):
        created = await client.post("/v1/sessions", json={"agent": agent}, headers=auth("alice"))
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        if text is not None:
            posted = await client.post(
                f"/v1/sessions/{sid}/messages", json={"text": text}, headers=auth("alice")
            )
            assert posted.status_code == 202, posted.text
            assert posted.json()["session_id"] == sid and "continued_from" not in posted.json()
        await until_row(store, sid, lambda row, t=text: row["turns"] == (1 if t else 0))
        sids.append(sid)
    return sids


async def _expire(where: Stack, store: ProjectionStore, sids: list[str]) -> int:
    clock = TestClock(ev.now_ms())
    expired_at = clock.advance(IDLE + dt.timedelta(minutes=1))
    async with where.opened(owner=False) as log:
        api = AgentSessions(
            log, agents(desk=Lifecycle(idle_expiry=IDLE), returning=Lifecycle(idle_expiry=IDLE))
        )
        sweeper = LifecycleSweeper(api, store, clock=clock, owned_only=bool(log.owned_partitions()))
        assert set((await sweeper.sweep_once()).expired) == set(sids)
    for sid in sids:
        await until_row(store, sid, lambda row: row["closed"] and row["closed_at_ms"] == expired_at)
    return expired_at


async def _refused(client: httpx.AsyncClient, sid: str, expired_at: int) -> None:
    when = dt.datetime.fromtimestamp(expired_at / 1000, dt.UTC).isoformat(timespec="seconds")[:19]
    for route in ("messages", "interrupt"):
        answer = await client.post(
            f"/v1/sessions/{sid}/{route}", json={"text": "still there?"}, headers=auth("alice")
        )
        assert answer.status_code == 409, answer.text
        body = answer.json()
        assert body["error"] == "session_expired"
        assert f"expired at {when}Z" in body["detail"] and "start a new session" in body["detail"]
    session = (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).json()
    assert (session["closed"], session["close_reason"], session["closed_at_ms"]) == (
        True,
        "expired",
        expired_at,
    )


async def _timeline(client: httpx.AsyncClient, sid: str, expired_at: int) -> None:
    timeline = (await client.get(f"/v1/sessions/{sid}/timeline", headers=auth("alice"))).json()
    (change,) = timeline["state_changes"]
    assert (change["from_state"], change["to_state"], change["cause"], change["at_ms"]) == (
        "IDLE",
        "FINISHED",
        "expired",
        expired_at,
    )
    (closed,) = [e for e in timeline["events"] if e["type"] == "SessionClosed"]
    assert (closed["reason"], closed["actor"], closed["time_ms"]) == ("expired", "lifecycle", expired_at)
    assert timeline["session"]["close_reason"] == "expired"


async def _continued(client: httpx.AsyncClient, store: ProjectionStore, sid: str) -> None:
    answer = await client.post(
        f"/v1/sessions/{sid}/messages", json={"text": "I'm back"}, headers=auth("alice")
    )
    assert answer.status_code == 202, answer.text
    successor = successor_id(sid)
    assert (answer.json()["session_id"], answer.json()["continued_from"]) == (successor, sid)
    row = await until_row(store, successor, lambda row: row["turns"] == 1)
    assert (row["agent_id"], row["user_id"], row["closed"]) == ("returning", "alice", False)
    history = (await client.get(f"/v1/sessions/{successor}/history", headers=auth("alice"))).json()
    assert [m["content"] for m in history["messages"]] == ["I'm back", "answer to I'm back"]
    assert (await client.get(f"/v1/sessions/{successor}", headers=auth("bob"))).status_code == 404
    again = await client.post(f"/v1/sessions/{sid}/messages", json={"text": "again"}, headers=auth("alice"))
    assert again.json()["session_id"] == successor  # every later message goes there too


async def _viewer(url: str, talked: str, silent: str) -> None:
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{url}/viewer")
            await page.fill("#key", KEYS["alice"])
            await page.click("#load")
            row = page.locator(f'tr.session[data-session="{talked}"]')
            await expect(row.locator("td.state .sub-line")).to_have_text("expired")
            await page.locator(f'tr.session[data-session="{silent}"]').click()
            await expect(page.locator("#session-closed")).to_contain_text("expired at")
            await expect(page.locator("#session-events")).to_contain_text("expired (closed by lifecycle)")
            await expect(page.locator("#transitions")).to_contain_text("expired")
            assert errors == []
        finally:
            await browser.close()


async def test_a_gateway_that_owns_nothing_continues_an_expired_session(where: Stack) -> None:
    """On Kafka a gateway without a worker owns no partition: the successor is created and the
    message posted through the inbox, and the worker (here, in the test process) answers it."""
    directory = agents(returning=Lifecycle(idle_expiry=IDLE, after_expiry="new_session"))
    store = where.store()
    try:
        async with where.opened(owner=True) as log:
            async with worker_on(log, directory):
                with serve(where, directory, run_worker=False) as url:
                    async with httpx.AsyncClient(base_url=url, timeout=30, headers=auth("alice")) as client:
                        created = await client.post("/v1/sessions", json={"agent": "returning"})
                        sid = created.json()["session_id"]
                        await until_row(store, sid, lambda row: row["state_version"] >= 1)
                        clock = TestClock(ev.now_ms())
                        clock.advance(IDLE + dt.timedelta(minutes=1))
                        sweeper = LifecycleSweeper(AgentSessions(log, directory), store, clock=clock)
                        assert (await sweeper.sweep_once()).expired == [sid]
                        await until_row(store, sid, lambda row: row["closed"])
                        answer = await client.post(f"/v1/sessions/{sid}/messages", json={"text": "back"})
                        assert answer.status_code == 202, answer.text
                        assert answer.json()["session_id"] == successor_id(sid)
                        await until_row(store, successor_id(sid), lambda row: row["turns"] == 1)
    finally:
        store.close()


async def test_an_agui_thread_whose_session_expired_runs_in_its_successor(where: Stack) -> None:
    directory = agents(returning=Lifecycle(idle_expiry=IDLE, after_expiry="new_session"))
    store = where.store()
    try:
        with serve(where, directory) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30, headers=auth("alice")) as client:
                first = await _agui_run(client, "thread-1", "hello")
                sid = first["session_id"]
                await until_row(store, sid, lambda row: row["turns"] == 1)
                await _expire(where, store, [sid])
                second = await _agui_run(client, "thread-1", "hello again")
                assert (second["session_id"], second["reason"]) == (successor_id(sid), "answered")
    finally:
        store.close()


async def _agui_run(client: httpx.AsyncClient, thread: str, text: str) -> dict[str, Any]:
    """POST one AG-UI run and read its events until RUN_FINISHED; its result."""
    message = {"id": ev.new_id(), "role": "user", "content": text}
    run = {"threadId": thread, "runId": ev.new_id(), "state": {}, "tools": [], "context": [],
           "forwardedProps": {}, "messages": [message]}  # fmt: skip
    async with asyncio.timeout(WAIT_S):
        async with client.stream("POST", "/v1/agui/returning", json=run) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data:") and '"RUN_FINISHED"' in line:
                    result: dict[str, Any] = json.loads(line[5:])["result"]
                    return result
    raise AssertionError("the run ended without RUN_FINISHED")
