"""The AG-UI endpoint, driven by the official JavaScript client (@ag-ui/client HttpAgent, run by
Node from tests/agui, installed by scripts/test.sh from its lockfile). The client's verifier
rejects protocol violations; the test then compares what it assembled with the log."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_support import KEYS, RunningGateway, open_log, serve_gateway
from turnlog.engine import events as ev
from turnlog.gateway.agui import thread_session_id

AGUI = Path(__file__).resolve().parent / "agui"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (AGUI / "node_modules" / "@ag-ui" / "client").is_dir(),
    reason="needs Node and tests/agui/node_modules (scripts/test.sh runs npm ci there)",
)


def run_client(running: RunningGateway, user: str, thread: str, run: str, text: str) -> dict[str, Any]:
    done = subprocess.run(
        ["node", "run_agent.mjs", f"{running.url}/v1/agui/support", KEYS[user], thread, run, text],
        cwd=AGUI, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def types(result: dict[str, Any]) -> list[str]:
    return [e["type"] for e in result["events"]]


async def test_the_official_client_runs_a_turn_and_accepts_every_event(tmp_path: Path) -> None:
    with serve_gateway(tmp_path) as running:
        first = run_client(running, "alice", "thread-1", "run-1", "Where is order A-17?")
        second = run_client(running, "alice", "thread-1", "run-2", "And order B-2?")
        bobs = run_client(running, "bob", "thread-1", "run-1", "Where is order A-17?")
        sid = thread_session_id("alice", "thread-1")
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            session = await client.get(
                f"/v1/sessions/{sid}", headers={"Authorization": f"Bearer {KEYS['alice']}"}
            )
            assert session.status_code == 200 and session.json()["turns"] == 2
    assert first["ok"], first
    got = types(first)
    assert got[0] == "RUN_STARTED" and got[-1] == "RUN_FINISHED"
    for kind in ("STATE_SNAPSHOT", "STATE_DELTA", "STEP_STARTED", "STEP_FINISHED", "TOOL_CALL_START",
                 "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT", "TEXT_MESSAGE_START",
                 "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"):  # fmt: skip
        assert kind in got, kind

    log = open_log(running.log_path)
    try:
        events = await log.read_session(sid)
    finally:
        await log.close()
    # the client assembled the same conversation the log holds
    answers = [e.text for e in events if isinstance(e, ev.AssistantMessage) and e.text]
    assistant = [m for m in first["messages"] if m["role"] == "assistant" and m.get("content")]
    assert [m["content"] for m in assistant] == answers[:1]
    calls = [m for m in first["messages"] if m["role"] == "assistant" and m.get("toolCalls")]
    requested = [e for e in events if isinstance(e, ev.ToolCallRequested)]
    assert calls[0]["toolCalls"][0]["function"]["name"] == requested[0].tool_name
    assert calls[0]["toolCalls"][0]["function"]["arguments"] == requested[0].arguments_json
    results = [m for m in first["messages"] if m["role"] == "tool"]
    finished = [e for e in events if isinstance(e, ev.ToolCallFinished)]
    assert [r["content"] for r in results] == [finished[0].content]
    assert first["state"]["status"] == "FINISHED" and first["state"]["session_id"] == sid

    # a second run continues the same session; another user's same thread id is another session
    assert second["ok"] and types(second)[-1] == "RUN_FINISHED"
    texts = [e.text for e in events if isinstance(e, ev.UserMessageReceived)]
    assert texts == ["Where is order A-17?", "And order B-2?"]
    assert bobs["ok"] and bobs["state"]["session_id"] == thread_session_id("bob", "thread-1") != sid


async def test_agui_rejects_bad_input_with_4xx(tmp_path: Path) -> None:
    with serve_gateway(tmp_path) as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            headers = {"Authorization": f"Bearer {KEYS['alice']}"}
            no_user = {"threadId": "t", "runId": "r", "state": {}, "messages": [], "tools": [], "context": [],
                       "forwardedProps": {}}  # fmt: skip
            response = await client.post("/v1/agui/support", json=no_user, headers=headers)
            assert response.status_code == 422 and "no user message" in response.json()["detail"]
            response = await client.post("/v1/agui/support", json={"threadId": 5}, headers=headers)
            assert response.status_code == 422 and response.json()["error"] == "invalid_input"
            response = await client.post("/v1/agui/nope", json=no_user, headers=headers)
            assert response.status_code == 404
            assert (await client.post("/v1/agui/support", json=no_user)).status_code == 401
