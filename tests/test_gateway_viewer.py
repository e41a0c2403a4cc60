"""The trace viewer page in headless Chromium (Debian's, driven by Playwright), under its real
Content-Security-Policy: the session list with filters and cost sort, one session's timeline
(model calls with cost, retries and fallbacks, tool calls, guard stops, approvals, snapshots,
events the page has no special view for, state transitions), the usage and metrics charts with
their values, the admin's fork, what a user's key sees, a session followed live as its turn
runs, and the owner approving, editing, rejecting and cancelling refunds of the logistics
example. The page is checked to fit at 1280 px (no column of the list cut off); screenshots at
1280 and 1920 px go to test-artifacts/ (kept by CI as artifacts, ignored by git)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_support import KEYS, RunningGateway, auth, open_log, serve_gateway, sse_messages
from turnlog.engine import events as ev

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
NARROW, WIDE = 1280, 1920
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium (scripts/test.sh installs it when it can)"
)


@contextlib.asynccontextmanager
async def viewer(running: RunningGateway, width: int = NARROW) -> AsyncIterator[tuple[Any, list[str]]]:
    """The viewer page open in headless Chromium, and the page errors and Content-Security-Policy
    violations it raises; a test asserts there are none once it is done."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": width, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            csp = "Content Security Policy"
            page.on("console", lambda m: errors.append(m.text) if csp in m.text else None)
            response = await page.goto(f"{running.url}/viewer")
            assert response is not None
            headers = await response.all_headers()
            assert "script-src 'sha256-" in headers["content-security-policy"]
            assert "frame-ancestors 'none'" in headers["content-security-policy"]
            assert (headers["x-frame-options"], headers["x-content-type-options"]) == ("DENY", "nosniff")
            yield page, errors
        finally:
            await browser.close()


async def shoot(page: Any, name: str) -> None:
    """Screenshots at the narrow and the wide width (the page is left at the narrow one)."""
    ARTIFACTS.mkdir(exist_ok=True)
    for width in (WIDE, NARROW):
        await page.set_viewport_size({"width": width, "height": 900})
        await page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)


async def assert_the_list_fits(page: Any) -> None:
    """Every column of the session list is inside its pane and no number in it is cut off."""
    fits = await page.evaluate(
        """() => {
          const pane = document.getElementById("list-pane").getBoundingClientRect();
          const cells = [...document.querySelectorAll("#sessions th, #sessions td")];
          const outside = cells.filter((c) => c.getBoundingClientRect().right > pane.right + 0.5).length;
          const cut = [...document.querySelectorAll("#sessions td.num, #sessions td:last-child")]
            .filter((c) => c.scrollWidth > c.clientWidth).map((c) => c.textContent);
          return { outside, cut, page: document.documentElement.scrollWidth - window.innerWidth };
        }"""
    )
    assert fits == {"outside": 0, "cut": [], "page": 0}, fits


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


async def add_an_outage(running: RunningGateway, sid: str) -> None:
    """The breaker of the troubled agent's primary opening and a call it sent to the backup, as the
    engine writes them (tests/test_model_outages.py makes them happen for real)."""
    log = open_log(running.log_path)
    try:
        events = await log.read_session(sid)
        turn_id = next(e.turn_id for e in events if isinstance(e, ev.TurnStarted))
        v = events[-1].version
        common: dict[str, Any] = {"session_id": sid, "turn_id": turn_id, "correlation_id": turn_id, "step": 2}
        await log.append(
            [
                ev.ModelBreakerChanged(
                    **common, version=v + 1, model="primary", endpoint="http://127.0.0.1:9/v1",
                    from_state="closed", to_state="open", producer="gateway-worker",
                    reason="5 of the 5 calls that ended within 30 s failed, the last with ModelError: 503",
                ),
                ev.ModelFallback(
                    **common, version=v + 2, from_model="primary", to_model="backup", cause="breaker_open",
                    reason="the breaker of primary at 127.0.0.1:9 is open (5 of the 5 calls failed)",
                ),
            ],
            expected_version=v,
        )  # fmt: skip
    finally:
        await log.close()


async def test_the_viewer_lists_sessions_and_shows_a_timeline(tmp_path: Path) -> None:
    from playwright.async_api import expect

    with serve_gateway(tmp_path) as running:
        alice = await one_turn(running, "alice", "Where is order A-17?")
        await one_turn(running, "bob", "Where is <b>order</b> B-2?")
        troubled = await one_turn(running, "alice", "Where is A-17, again?", agent="troubled")
        small = await one_turn(running, "alice", "And A-17 once more?", agent="small")
        await add_events_the_viewer_does_not_know(running, alice)
        await add_an_outage(running, troubled)
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            daily = (await client.get("/v1/admin/analytics/daily?days=1", headers=auth("root"))).json()
        async with viewer(running) as (page, errors):
            # an admin sees every user's sessions, filters them, and gets the charts with their values
            await page.fill("#key", KEYS["root"])
            await page.click("#load")
            await expect(page.locator("tr.session")).to_have_count(4)
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
                await expect(page.locator(f"#chart-{chart}")).to_be_visible()  # loaded asynchronously
                assert await page.locator(f"#chart-{chart} .axis").count() == 1
            today = daily["days"][0]
            tokens = await page.locator("#chart-tokens").inner_text()
            assert today["day"] in tokens and f"{today['input_tokens'] + today['output_tokens']:,}" in tokens
            per_user = await page.locator("#chart-cost-user").inner_text()
            assert "alice" in per_user and "$0.000345" in per_user  # bob's identical turn: also $0.000345
            assert "lookup" in await page.locator("#chart-tool-success").inner_text()
            assert "FINISHED" in await page.locator("#chart-active").inner_text()
            await assert_the_list_fits(page)
            await shoot(page, "viewer-admin-list")
            await page.fill("#f-user", "alice")
            await page.click("#apply")
            await expect(page.locator("tr.session")).to_have_count(3)
            await page.select_option("#sort", "cost")
            row = page.locator("tr.session").first  # the support session is the only one that cost anything
            assert await row.get_attribute("data-session") == alice
            assert await row.locator("td.cost").inner_text() == "$0.000345"
            await page.fill("#f-min-cost", "0.001")
            await page.click("#apply")
            await expect(page.locator("tr.session")).to_have_count(0)
            await page.fill("#f-min-cost", "")
            await page.click("#apply")
            await expect(page.locator("tr.session")).to_have_count(3)

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
            head = await page.locator(".turn .turn-head").inner_text()
            assert "answered · 2 model calls · 1 tool step · 63 tokens · $0.000345" in head
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
            await shoot(page, "viewer-admin-timeline")

            # fallbacks, retries and the guard stop of a troubled turn
            await page.locator(f'tr.session[data-session="{troubled}"]').click()
            await page.wait_for_selector('.turn [data-type="LoopGuardTriggered"]')
            assert await page.locator('[data-type="ModelFallback"]').count() == 5
            assert "primary → backup" in await page.locator('[data-type="ModelFallback"]').first.inner_text()
            assert "breaker open" not in await page.locator('[data-type="ModelFallback"]').first.inner_text()
            skipped = await page.locator('[data-type="ModelFallback"]').last.inner_text()
            assert "breaker open: the call went to the backup" in skipped and "is open (5 of the 5" in skipped
            breaker = await page.locator('[data-type="ModelBreakerChanged"]').inner_text()
            assert "breaker of primary (http://127.0.0.1:9/v1) at model call 2: closed → open" in breaker
            assert "worker gateway-worker" in breaker and "5 of the 5 calls" in breaker
            assert await page.locator(".step.model .retries").count() == 4
            assert "guard stop: repeated_call" in await page.locator(".turn .guard-stop").inner_text()
            assert await page.locator('[data-type="ToolResultSuperseded"] pre.fields').count() == 1
            assert "PROCESSING → FINISHED" in await page.locator("#transitions").inner_text()
            assert "guard" in await page.locator("#transitions td.cause").all_inner_texts()
            assert "cost unknown" in await page.locator("#session-meta").inner_text()  # no price table
            await shoot(page, "viewer-guard-and-fallbacks")

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
            await expect(page.locator("tr.session")).to_have_count(4)
            await page.screenshot(path=str(ARTIFACTS / "viewer-fork.png"), full_page=True)

            # a user's key sees only their own sessions and no charts; model text is never HTML
            await page.fill("#key", KEYS["bob"])
            await page.fill("#f-user", "")
            await page.click("#load")
            await expect(page.locator("#who")).to_have_text("your sessions")
            await expect(page.locator("tr.session")).to_have_count(1)
            assert await page.locator("figure.chart").count() == 0  # the admin's charts are gone
            assert await page.locator(".turn").count() == 0  # and so is the admin's timeline
            await page.locator("tr.session").click()
            await page.wait_for_selector(".turn")
            assert "Where is <b>order</b> B-2?" in await page.locator(".turn .step").first.inner_text()
            assert await page.locator(".turn b").count() == 0
            assert await page.locator("button.fork").count() == 0  # forking is the admin's
            await shoot(page, "viewer-user")
    assert errors == []


async def test_the_viewer_follows_a_running_turn_live(tmp_path: Path) -> None:
    """The page shows a turn that starts after it was opened, its streamed text as it comes, and
    its end, without a click or a reload: it follows the session's event stream."""
    from playwright.async_api import expect

    with serve_gateway(tmp_path) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            created = await client.post("/v1/sessions", json={"agent": "support"}, headers=auth("alice"))
            sid = created.json()["session_id"]
            async with viewer(running) as (page, errors):
                await page.fill("#key", KEYS["alice"])
                await page.click("#load")
                await page.locator("tr.session").click()
                await expect(page.locator("#live")).to_have_text("● live")
                assert await page.locator(".turn").count() == 0

                running.model.gate.clear()  # the answer stops half-way until the gate opens
                url = f"/v1/sessions/{sid}/messages"
                await client.post(url, json={"text": "Where is A-17?"}, headers=auth("alice"))
                live = page.locator("pre.live")
                await expect(live).to_have_text(running.model.first_half)  # streamed tokens, live
                head = page.locator(".turn .turn-head")
                await expect(head).to_contain_text("running · 2 model calls so far · 1 tool step")
                assert "tool lookup" in await page.locator(".turn .step.tool").inner_text()
                await expect(page.locator(f'tr.session[data-session="{sid}"] td.state')).to_contain_text(
                    "PROCESSING"
                )
                await shoot(page, "viewer-live-turn")

                running.model.gate.set()
                await expect(head).to_contain_text("answered · 2 model calls · 1 tool step")
                await expect(page.locator("pre.live")).to_have_count(0)
                answer = running.model.first_half + running.model.second_half
                await expect(page.locator(".step.model").nth(1)).to_contain_text(answer)
                await expect(page.locator(f'tr.session[data-session="{sid}"] td.state')).to_contain_text(
                    "FINISHED"
                )
    assert errors == []


async def ask(running: RunningGateway, sid: str, text: str) -> None:
    """Post to the logistics session as alice (the page has no message box: that is the app's)."""
    async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
        posted = await client.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=auth("alice"))
        assert posted.status_code == 202, posted.text


async def test_the_owner_approves_edits_rejects_and_cancels_refunds_of_the_example_agent(
    tmp_path: Path,
) -> None:
    """The logistics example's refund waits for a person: the viewer's buttons decide it, the
    example's business system shows what ran; its model has no price, so its cost is unknown."""
    from playwright.async_api import expect

    with serve_gateway(tmp_path) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            created = await client.post(
                "/v1/sessions", json={"agent": "logistics-assistant"}, headers=auth("alice")
            )
            sid = created.json()["session_id"]
        shop = running.shop
        async with viewer(running) as (page, errors):
            await page.fill("#key", KEYS["alice"])
            await page.click("#load")
            await page.locator("tr.session").click()
            await expect(page.locator("#live")).to_have_text("● live")
            waiting = page.locator('[data-type="ApprovalRequested"]:has(button.approve)')

            # approve: the refund is made, the turn finishes, the buttons are gone
            await ask(running, sid, "Please refund 40 on order O-1003, it was lost.")
            await expect(waiting).to_have_count(1)
            asked = await waiting.inner_text()
            assert "refund" in asked and '"order_id": "O-1003"' in asked and "high" in asked
            assert await page.locator(".step.model .call-cost").first.inner_text() == "cost unknown"
            assert await page.locator("tr.session td.cost").inner_text() == "unknown"
            await shoot(page, "viewer-approval-pending")
            await waiting.locator("button.approve").click()
            await expect(page.locator(".turn").nth(0).locator(".answered")).to_have_count(1)
            assert shop.refunds == [
                {"order_id": "O-1003", "amount": 40.0, "reason": shop.refunds[0]["reason"]}
            ]
            await expect(page.locator(".turn").nth(0)).to_contain_text("Done: Refunded 40.00 on order O-1003")
            assert "approved by alice" in await page.locator('[data-type="ApprovalDecided"]').inner_text()
            assert await page.locator("button.approve").count() == 0

            # edit: the arguments typed into the page are the ones the refund runs with
            await ask(running, sid, "Refund 25 on O-1001 please.")
            await expect(waiting).to_have_count(1)
            edited = (await waiting.locator("textarea.edit-arguments").input_value()).replace("25.0", "20.5")
            await waiting.locator("textarea.edit-arguments").fill(edited)
            await waiting.locator("button.edit").click()
            await expect(page.locator(".turn").nth(1).locator(".answered")).to_have_count(1)
            assert [(r["order_id"], r["amount"]) for r in shop.refunds] == [
                ("O-1003", 40.0),
                ("O-1001", 20.5),
            ]
            assert (
                "edited by alice"
                in await page.locator(".turn").nth(1).locator('[data-type="ApprovalDecided"]').inner_text()
            )
            tool = await page.locator(".turn").nth(1).locator(".step.tool").inner_text()
            assert "approval: edited" in tool and '"amount": 20.5' in tool

            # reject: the refund is never made, and the answer says so
            await ask(running, sid, "Refund 30 on O-1003 as well.")
            await expect(waiting).to_have_count(1)
            await waiting.locator("button.reject").click()
            third = page.locator(".turn").nth(2)
            await expect(third.locator(".answered")).to_have_count(1)
            await expect(third.locator(".step.tool .approval-state.rejected")).to_have_count(1)
            await expect(third).to_contain_text("The refund was not made: [DECLINED BY USER]")
            assert len(shop.refunds) == 2

            # cancel: a turn paused for approval is a running turn, and stops as CANCELLED
            await ask(running, sid, "And refund 5 on O-1003.")
            await expect(waiting).to_have_count(1)
            await page.locator("button.cancel-turn").click()
            fourth = page.locator(".turn").nth(3)
            await expect(fourth.locator(".turn-head .cancelled")).to_have_count(1)
            assert (
                "cancel requested by alice"
                in await fourth.locator('[data-type="CancelRequested"]').inner_text()
            )
            await expect(page.locator(f'tr.session[data-session="{sid}"] td.state')).to_contain_text(
                "CANCELLED"
            )
            assert "PAUSED_FOR_USER → CANCELLED" in await page.locator("#transitions").inner_text()
            assert len(shop.refunds) == 2
            assert "cost unknown" in await page.locator("#session-meta").inner_text()
            await assert_the_list_fits(page)
            await shoot(page, "viewer-owner-actions")
    assert errors == []


async def test_an_experiment_started_over_http_and_read_in_the_viewer(tmp_path: Path) -> None:
    """Sessions recorded by a model that skipped a notice, replayed over the admin route against
    the gateway's example agent (which sends every notice): the report shows the task turns
    differing, the notice the recording has no answer for is never sent, the answers stand side by
    side in the viewer, and the replay opens as a session of its own."""
    import datetime as dt

    from tests.agentpkg.experiments import _response, _skip_first_notice
    from turnlog.engine import AgentDirectory, AgentSessions, FunctionModel
    from turnlog.examples.logistics import TASK, LogisticsBackend, build_agent, demo_model

    decide = demo_model().fn
    skipping = FunctionModel(lambda r: _skip_first_notice(_response(decide(r))), name="scripted-demo")
    recorded = build_agent(
        skipping, LogisticsBackend(today=dt.date.today(), reports_dir=tmp_path / "recorded")
    )
    log = open_log(tmp_path / "log.db")
    try:
        api = AgentSessions(log, AgentDirectory([recorded]))
        origins = []
        for user in ("alice", "bob"):
            session = await api.create_session("logistics-assistant", user)
            async for _ in api.send_user_message(session.session_id, TASK):
                pass
            origins.append(session.session_id)
    finally:
        await log.close()
    with serve_gateway(tmp_path) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            body = {
                "agent": "logistics-assistant",
                "select": {"session_ids": origins},
                "name": "full notices",
            }
            denied = await client.post("/v1/admin/experiments", json=body, headers=auth("alice"))
            assert denied.status_code == 403
            unknown = {**body, "select": {"session_ids": ["no-such-session"]}}
            missing = await client.post("/v1/admin/experiments", json=unknown, headers=auth("root"))
            assert (missing.status_code, missing.json()["error"]) == (404, "no_sessions_selected")
            assert "no-such-session" in missing.json()["detail"]
            started = await client.post("/v1/admin/experiments", json=body, headers=auth("root"))
            assert started.status_code == 202, started.text
            eid = started.json()["experiment_id"]
            for _ in range(2400):  # until the background run is over
                report = (await client.get(f"/v1/admin/experiments/{eid}", headers=auth("root"))).json()
                if not report["running"]:
                    break
                await asyncio.sleep(0.05)
            summary = report["summary"]
            assert (
                summary["sessions_complete"],
                summary["sessions_divergent"],
                summary["turns_divergent"],
            ) == (2, 2, 2)
            for s in report["sessions"]:
                [turn] = s["turn_diffs"]
                assert [c["tool"] for c in turn["tool_calls"]["added"]] == ["send_notification"]
                assert {c["tool"] for c in turn["tool_calls"]["unmatched"]} == {
                    "send_notification",
                    "save_report",
                }
            assert running.gateway.api.agents.get("logistics-assistant")  # the candidate
            listed = (await client.get("/v1/admin/sessions?limit=500", headers=auth("root"))).json()[
                "sessions"
            ]
            assert {s["session_id"] for s in listed} == set(origins)  # replays stay out of the listing
        async with viewer(running) as (page, errors):
            await page.fill("#key", KEYS["root"])
            await page.click("#load")
            await page.click(f'#experiments tr[data-experiment="{eid}"]')
            await page.wait_for_selector("#experiment-summary")
            assert "2 sessions differ" in await page.inner_text("#timeline")
            recorded_answer = await page.inner_text(".answer-recorded >> nth=0")
            replayed_answer = await page.inner_text(".answer-replayed >> nth=0")
            assert recorded_answer.startswith("Last week had") and replayed_answer != recorded_answer
            changes = await page.inner_text(".call-change >> nth=0")
            assert changes.startswith("+ send_notification")
            await shoot(page, "experiment")
            await page.click(".open-replay >> nth=0")
            await page.wait_for_selector("#session-meta")
            assert (await page.inner_text("#timeline h2")).startswith("Session exp-")
            assert errors == []


async def test_an_experiment_that_fails_in_the_background_shows_as_failed(tmp_path: Path) -> None:
    """A from_turn past what the sessions have is refused with the valid range; an experiment
    whose replay fails (a recorded turn waited for an approval, which a replay cannot give) ends
    as failed, with its reason, in the list, in its report and in the viewer."""
    with serve_gateway(tmp_path) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            sid = (
                await client.post("/v1/sessions", json={"agent": "refunds"}, headers=auth("alice"))
            ).json()["session_id"]
            for text in ("Refund A-17", "And once more"):  # each turn waits for alice's approval
                await client.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=auth("alice"))
                session = await state_of(client, sid, lambda s: s["current_state"] == "PAUSED_FOR_USER")
                call_id = session["pending_approvals"][0]["call_id"]
                url = f"/v1/sessions/{sid}/approvals/{call_id}"
                assert (
                    await client.post(url, json={"decision": "approve"}, headers=auth("alice"))
                ).status_code == 202
                await state_of(
                    client, sid, lambda s: s["current_state"] == "FINISHED" and not s["turn_running"]
                )

            body = {"agent": "refunds", "select": {"session_ids": [sid]}, "name": "refunds again"}
            for wrong in (2**62, 3, -1):
                refused = await client.post(
                    "/v1/admin/experiments", json={**body, "from_turn": wrong}, headers=auth("root")
                )
                assert (refused.status_code, refused.json()["error"]) == (422, "invalid_input"), refused.text
                assert "from_turn must be in 0..2 " in refused.json()["detail"]
            assert (await client.get("/v1/admin/experiments", headers=auth("root"))).json()[
                "experiments"
            ] == []

            started = await client.post("/v1/admin/experiments", json=body, headers=auth("root"))
            assert started.status_code == 202, started.text
            eid = started.json()["experiment_id"]
            for _ in range(2400):  # until the background run is over
                report = (await client.get(f"/v1/admin/experiments/{eid}", headers=auth("root"))).json()
                if not report["running"]:
                    break
                await asyncio.sleep(0.05)
            assert report["status"] == "failed"
            assert report["error"].startswith(
                f"1 of 1 sessions could not be replayed; session {sid}: InputError"
            )
            assert "approvals are not replayed" in report["error"]
            assert "approvals are not replayed" in report["sessions"][0]["error"]
            (listed,) = (await client.get("/v1/admin/experiments", headers=auth("root"))).json()[
                "experiments"
            ]
            assert (listed["experiment_id"], listed["status"], listed["error"]) == (
                eid,
                "failed",
                report["error"],
            )

        async with viewer(running) as (page, errors):
            await page.fill("#key", KEYS["root"])
            await page.click("#load")
            row = page.locator(f'#experiments tr[data-experiment="{eid}"]')
            assert await row.locator("td.experiment-failed").inner_text() == "failed"
            assert "approvals are not replayed" in str(
                await row.locator("td.experiment-failed").get_attribute("title")
            )
            await row.click()
            await page.wait_for_selector("#experiment-error")
            shown = await page.inner_text("#experiment-error")
            assert shown.startswith("failed: 1 of 1 sessions could not be replayed") and "approvals" in shown
            await shoot(page, "experiment-failed")
            assert errors == []


async def state_of(client: httpx.AsyncClient, sid: str, ready: Any) -> dict[str, Any]:
    """GET the session until ``ready`` holds (the gateway's worker runs the turns)."""
    for _ in range(600):
        session: dict[str, Any] = (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).json()
        if ready(session):
            return session
        await asyncio.sleep(0.05)
    raise AssertionError(f"the session never got there; last seen: {session}")
