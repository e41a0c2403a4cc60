"""The trace viewer page in headless Chromium (Debian's, driven by Playwright): the session list
with filters and cost sort, one session's timeline (model calls with cost, retries and fallbacks,
tool calls, guard stops, approvals, snapshots, events the page has no special view for, state
transitions), the usage and metrics charts, the admin's fork and the owner's approve / reject /
cancel buttons, and what a user's key sees. Screenshots go to test-artifacts/ (kept by CI as
artifacts, ignored by git)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import events as ev
from tests.gateway_support import KEYS, RunningGateway, auth, open_log, serve_gateway, sse_messages

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium (scripts/test.sh installs it when it can)"
)


@contextlib.asynccontextmanager
async def viewer(running: RunningGateway) -> AsyncIterator[tuple[Any, list[str]]]:
    """The viewer page open in headless Chromium, and the page errors it raises (a test asserts
    there are none once it is done)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{running.url}/viewer")
            yield page, errors
        finally:
            await browser.close()


async def one_turn(running: RunningGateway, user: str, text: str, agent: str = "support") -> str:
    async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"agent": agent}, headers=auth(user))
        sid: str = created.json()["session_id"]
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth(user)) as response:
            await client.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=auth(user))
            async for message in sse_messages(response):
                if message.event in ("TurnFinished", "ApprovalRequested"):
                    break
        await client.get("/v1/admin/analytics/daily", headers=auth("root"))  # the consumer catches up
        return sid


async def pause_for_approval(running: RunningGateway, sid: str, text: str) -> None:
    """Post to a refunds session and wait until its refund waits for a decision."""
    async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
        await client.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=auth("alice"))
        for _ in range(600):
            session = (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).json()
            if session["pending_approvals"]:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the refund never waited for approval")


async def add_events_the_viewer_does_not_know(running: RunningGateway, sid: str) -> None:
    """Context and memory events (issue 8's) on the session's log, as the engine will write them."""
    log = open_log(running.log_path)
    try:
        events = await log.read_session(sid)
        turn_id = next(e.turn_id for e in events if isinstance(e, ev.TurnStarted))
        v = events[-1].version
        common: dict[str, Any] = {"session_id": sid, "turn_id": turn_id, "correlation_id": turn_id}
        await log.append(
            [
                ev.TaskStateChanged(
                    **common, version=v + 1, call_id="c1", op="set",
                    patch_json='[{"op": "replace", "path": "/order", "value": "A-17"}]',
                    state_json='{"order": "A-17"}',
                ),
                ev.HistorySummarized(
                    **common, version=v + 2, step=0, removed_refs_json="[]", summary="Asked about A-17.",
                    summarizer="extractive", reason="tokens", tokens_before=900, tokens_after=120,
                ),
                ev.MemoryNoted(
                    **common, version=v + 3, call_id="c2", user_id="alice", text="prefers email",
                    tag="preference",
                ),
            ],
            expected_version=v,
        )  # fmt: skip
    finally:
        await log.close()


async def test_the_viewer_lists_sessions_and_shows_a_timeline(tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with serve_gateway(tmp_path) as running:
        alice = await one_turn(running, "alice", "Where is order A-17?")
        await one_turn(running, "bob", "Where is <b>order</b> B-2?")
        troubled = await one_turn(running, "alice", "Where is A-17, again?", agent="troubled")
        small = await one_turn(running, "alice", "And A-17 once more?", agent="small")
        await add_events_the_viewer_does_not_know(running, alice)
        async with viewer(running) as (page, errors):
            # an admin sees every user's sessions, filters them, and gets the charts
            await page.fill("#key", KEYS["root"])
            await page.click("#load")
            await page.wait_for_function("document.querySelectorAll('tr.session').length === 4")
            for chart in (
                "tokens",
                "turns",
                "guard-stops",
                "tool-success",
                "cost-day",
                "cost-user",
                "active",
                "ttft",
            ):
                await page.wait_for_selector(f"#chart-{chart}")  # loaded asynchronously
            assert "alice" in await page.locator("#chart-cost-user").inner_text()
            await page.fill("#f-user", "alice")
            await page.click("#apply")
            await page.wait_for_function("document.querySelectorAll('tr.session').length === 3")
            await page.select_option("#sort", "cost")
            row = page.locator("tr.session").first  # the support session is the only one that cost anything
            assert await row.get_attribute("data-session") == alice
            assert await row.locator("td.cost").inner_text() == "$0.000345"
            await page.fill("#f-min-cost", "0.001")
            await page.click("#apply")
            await page.wait_for_function("document.querySelectorAll('tr.session').length === 0")
            await page.fill("#f-min-cost", "")
            await page.click("#apply")
            await page.wait_for_function("document.querySelectorAll('tr.session').length === 3")

            # one session's timeline: the turn, its model calls, the tool call, the transitions
            await page.locator(f'tr.session[data-session="{alice}"]').click()
            await page.wait_for_selector(".turn .step.tool")
            tool = page.locator(".step.tool")
            assert "tool lookup" in await tool.inner_text() and "success" in await tool.inner_text()
            assert '{"order_id": "A-17"}' in await tool.locator("pre").first.inner_text()
            steps = await page.locator(".turn .step").evaluate_all(
                "nodes => nodes.map(n => n.dataset.type || n.className)"
            )
            assert steps == [
                "step",
                "step model",
                "step tool",
                "SnapshotTaken",
                "step model",
                "SnapshotTaken",
                "TaskStateChanged",
                "HistorySummarized",
                "MemoryNoted",
            ]  # fmt: skip  user, model 0, tool, snapshot, model 1, snapshot, then the events added
            assert "$0.000135" in await page.locator(".step.model").first.inner_text()  # 20 in, 5 out
            assert "cost $0.000345" in await page.locator("#session-meta").inner_text()
            assert running.model.second_half in await page.locator(".step.model").nth(1).inner_text()
            await page.locator(".step.model").nth(1).locator("button.sent").click()
            await page.wait_for_selector(".step.model >> nth=1 >> .sent-message")
            sent = await page.locator(".step.model").nth(1).locator(".sent-message").all_inner_texts()
            assert [line.split("]")[0] for line in sent] == ["[system", "[user", "[assistant", "[tool lookup"]
            assert 'lookup({"order_id": "A-17"})' in sent[2] and '"status":"delayed"' in sent[3]
            transitions = await page.locator("#transitions").inner_text()
            assert "IDLE → PROCESSING" in transitions and "model_answer" in transitions
            # events the page has no special view for still show, with their fields
            task = await page.locator('[data-type="TaskStateChanged"]').inner_text()
            assert "task state set" in task and '"/order"' in task and '{"order": "A-17"}' in task
            summary = await page.locator('[data-type="HistorySummarized"]').inner_text()
            assert "900 → 120 tokens" in summary and "Asked about A-17." in summary
            memory = await page.locator('[data-type="MemoryNoted"]').inner_text()
            assert "text: prefers email" in memory and "tag: preference" in memory
            await page.screenshot(path=str(ARTIFACTS / "viewer-admin-timeline.png"), full_page=True)

            # fallbacks, retries and the guard stop of a troubled turn
            await page.locator(f'tr.session[data-session="{troubled}"]').click()
            await page.wait_for_selector('.turn [data-type="LoopGuardTriggered"]')
            assert await page.locator('[data-type="ModelFallback"]').count() == 4
            assert "primary → backup" in await page.locator('[data-type="ModelFallback"]').first.inner_text()
            assert await page.locator(".step.model .retries").count() == 4
            assert "guard stop: repeated_call" in await page.locator(".turn .guard-stop").inner_text()
            assert await page.locator('[data-type="ToolResultSuperseded"] pre.fields').count() == 1
            assert "PROCESSING → FINISHED" in await page.locator("#transitions").inner_text()
            assert "guard" in await page.locator("#transitions td.cause").all_inner_texts()
            await page.screenshot(path=str(ARTIFACTS / "viewer-guard-and-fallbacks.png"), full_page=True)

            # a model given tools through its prompt repeated its call: the correction it got
            await page.locator(f'tr.session[data-session="{small}"]').click()
            await page.wait_for_selector('.turn [data-type="ModelCorrected"]')
            corrected = page.locator('.turn [data-type="ModelCorrected"]')
            assert (
                "correction (repeated_call) at model call 1, answer 1 · not run: lookup"
                in await corrected.inner_text()
            )
            assert '"lookup"' in await corrected.locator("pre.model-text").inner_text()
            assert "told: These calls were already made" in await corrected.locator("pre.told").inner_text()
            assert await page.locator(".step.tool").count() == 1  # the repeat never ran

            # the admin forks the support session from its last snapshot; the fork opens
            await page.locator(f'tr.session[data-session="{alice}"]').click()
            await page.wait_for_selector(".step.snapshot button.fork")
            await page.locator(".step.snapshot button.fork").last.click()
            await page.wait_for_selector("p.forked")
            assert f"forked from {alice}" in await page.locator("p.forked").inner_text()
            assert await page.locator('#session-events [data-type="SessionForked"]').count() == 1
            await page.wait_for_function("document.querySelectorAll('tr.session').length === 4")
            await page.screenshot(path=str(ARTIFACTS / "viewer-fork.png"), full_page=True)

            # a user's key sees only their own sessions and no charts; model text is never HTML
            await page.fill("#key", KEYS["bob"])
            await page.fill("#f-user", "")
            await page.click("#load")
            await page.wait_for_function(
                "document.querySelector('#who').textContent === 'your sessions' && "
                "document.querySelectorAll('tr.session').length === 1"
            )
            assert await page.locator("figure.chart").count() == 0  # the admin's charts are gone
            assert await page.locator(".turn").count() == 0  # and so is the admin's timeline
            await page.locator("tr.session").click()
            await page.wait_for_selector(".turn")
            assert "Where is <b>order</b> B-2?" in await page.locator(".turn .step").first.inner_text()
            assert await page.locator(".turn b").count() == 0
            assert await page.locator("button.fork").count() == 0  # forking is the admin's
            await page.screenshot(path=str(ARTIFACTS / "viewer-user.png"), full_page=True)
    assert errors == []


async def test_the_owner_approves_rejects_and_cancels_from_the_viewer(tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with serve_gateway(tmp_path) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            created = await client.post("/v1/sessions", json={"agent": "refunds"}, headers=auth("alice"))
            sid = created.json()["session_id"]
        await pause_for_approval(running, sid, "Refund A-17")
        async with viewer(running) as (page, errors):
            await page.fill("#key", KEYS["alice"])
            await page.click("#load")
            await page.locator("tr.session").click()

            # approve: the refund runs, the turn finishes, the buttons are gone
            asked = page.locator('[data-type="ApprovalRequested"]')
            await asked.locator("button.approve").wait_for()
            assert "refund" in await asked.inner_text() and "high" in await asked.inner_text()
            await page.screenshot(path=str(ARTIFACTS / "viewer-approval-pending.png"), full_page=True)
            await asked.locator("button.approve").click()
            await page.wait_for_selector(".step.tool .approval-state.approved")
            await page.wait_for_function("document.querySelector('.turn .answered') !== null")
            assert running.refunds == [{"order_id": "A-17", "amount": 40}]
            assert await page.locator("button.approve").count() == 0
            assert "approved by alice" in await page.locator('[data-type="ApprovalDecided"]').inner_text()

            # reject: the refund never runs
            await pause_for_approval(running, sid, "Another refund")
            await page.locator(f'tr.session[data-session="{sid}"]').click()
            await page.locator('[data-type="ApprovalRequested"] button.reject').last.wait_for()
            await page.locator('[data-type="ApprovalRequested"] button.reject').last.click()
            await page.wait_for_selector(".step.tool .approval-state.rejected")
            await page.wait_for_function("document.querySelectorAll('.turn .answered').length === 2")
            assert running.refunds == [{"order_id": "A-17", "amount": 40}]

            # cancel: a turn paused for approval is a running turn, and stops as CANCELLED
            await pause_for_approval(running, sid, "A third refund")
            await page.locator(f'tr.session[data-session="{sid}"]').click()
            await page.locator("button.cancel-turn").wait_for()
            await page.locator("button.cancel-turn").click()
            await page.wait_for_function(
                "[...document.querySelectorAll('.turn')].pop().querySelector('.cancelled')"
            )
            last_turn = page.locator(".turn").last
            assert (
                "cancel requested by alice"
                in await last_turn.locator('[data-type="CancelRequested"]').inner_text()
            )
            await page.wait_for_function(  # the list is refreshed after an action too
                f"document.querySelector('tr.session[data-session=\"{sid}\"]').textContent.includes('CANCELLED')"
            )
            assert "PAUSED_FOR_USER → CANCELLED" in await page.locator("#transitions").inner_text()
            assert running.refunds == [{"order_id": "A-17", "amount": 40}]
            await page.screenshot(path=str(ARTIFACTS / "viewer-owner-actions.png"), full_page=True)
    assert errors == []
