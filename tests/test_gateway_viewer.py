"""The trace viewer page in headless Chromium (Debian's, driven by Playwright): the session list
with filters and cost sort, one session's timeline, the usage charts, and what a user's key sees.
Screenshots go to test-artifacts/ (kept by CI as artifacts, ignored by git)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.gateway_support import KEYS, RunningGateway, auth, serve_gateway, sse_messages

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium (scripts/test.sh installs it when it can)"
)


async def one_turn(running: RunningGateway, user: str, text: str) -> str:
    async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"agent": "support"}, headers=auth(user))
        sid: str = created.json()["session_id"]
        async with client.stream("GET", f"/v1/sessions/{sid}/events", headers=auth(user)) as response:
            await client.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=auth(user))
            async for message in sse_messages(response):
                if message.event == "TurnFinished":
                    break
        await client.get("/v1/admin/analytics/daily", headers=auth("root"))  # the consumer catches up
        return sid


async def test_the_viewer_lists_sessions_and_shows_a_timeline(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with serve_gateway(tmp_path) as running:
        alice = await one_turn(running, "alice", "Where is order A-17?")
        await one_turn(running, "bob", "Where is <b>order</b> B-2?")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{running.url}/viewer")

            # an admin sees every user's sessions, filters them, and gets the charts
            await page.fill("#key", KEYS["root"])
            await page.click("#load")
            await page.wait_for_function("document.querySelectorAll('tr.session').length === 2")
            await page.wait_for_function("document.querySelectorAll('figure.chart').length === 3")  # async
            await page.fill("#f-user", "alice")
            await page.click("#apply")
            await page.wait_for_function("document.querySelectorAll('tr.session').length === 1")
            row = page.locator("tr.session")
            assert await row.get_attribute("data-session") == alice
            await page.select_option("#sort", "cost")

            # one session's timeline: the turn, its model calls, the tool call, the transitions
            await row.click()
            await page.wait_for_selector(".turn .step.tool")
            tool = page.locator(".step.tool")
            assert "tool lookup" in await tool.inner_text() and "success" in await tool.inner_text()
            assert '{"order_id": "A-17"}' in await tool.locator("pre").first.inner_text()
            steps = await page.locator(".turn .step").evaluate_all("nodes => nodes.map(n => n.className)")
            assert steps == ["step", "step model", "step tool", "step model"]  # user, model 0, tool, model 1
            assert running.model.second_half in await page.locator(".step.model").nth(1).inner_text()
            await page.locator(".step.model").nth(1).locator("button.sent").click()
            await page.wait_for_selector(".step.model >> nth=1 >> .sent-message")
            sent = await page.locator(".step.model").nth(1).locator(".sent-message").all_inner_texts()
            assert [line.split("]")[0] for line in sent] == ["[system", "[user", "[assistant", "[tool lookup"]
            assert 'lookup({"order_id": "A-17"})' in sent[2] and '"status":"delayed"' in sent[3]
            transitions = await page.locator("#transitions").inner_text()
            assert "IDLE → PROCESSING" in transitions and "model_answer" in transitions
            await page.screenshot(path=str(ARTIFACTS / "viewer-admin-timeline.png"), full_page=True)

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
            await page.screenshot(path=str(ARTIFACTS / "viewer-user.png"), full_page=True)
            await browser.close()
    assert errors == []
