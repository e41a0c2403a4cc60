"""The README's main job, end to end: `turnlog demo`, then sessions / show / rebuild, through the
real CLI in a subprocess; once with the offline scripted model and once against an
OpenAI-compatible HTTP server on loopback."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.openai_server import FakeReply, serve_openai
from turnlog.app import EmbeddedApp
from turnlog.engine import Agent, FunctionModel, ModelRequest, tool
from turnlog.engine.errors import ModelError
from turnlog.engine.models.prompt_tools import PromptToolsModel
from turnlog.examples.logistics.backend import last_week
from turnlog.projections import SqliteProjectionStore
from turnlog.projections.schema import READ_MODELS
from turnlog.render import duration

REPO = Path(__file__).resolve().parent.parent


def _env(columns: int = 200) -> dict[str, str]:
    """The CLI's environment: no model endpoint, and the scripted model unless a test asks (the
    local model may be installed: these tests must not start it)."""
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(REPO), "TURNLOG_DEMO_MODEL": "scripted"}
    for key in ("TURNLOG_BASE_URL", "OPENAI_BASE_URL", "TURNLOG_MODEL", "TURNLOG_HOME"):
        env.pop(key, None)
    return env


def turnlog(home: Path, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnlog", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        env=_env(columns),
        timeout=120,
        cwd=home.parent,
    )


def tables(home: Path) -> dict[str, list[dict]]:
    store = SqliteProjectionStore(home / "projections.db")
    try:
        return {name: store.table(name) for name in READ_MODELS}
    finally:
        store.close()


def remembered(home: Path, user: str, query: str) -> list[str]:
    """What the demo's memory store (the embedded default under the home) holds for ``user``."""
    from turnlog.engine.memory.stores import open_store

    async def search() -> list[str]:
        store = open_store(home / "memory")
        try:
            return [m.text for m in await store.search(user, query, limit=5)]
        finally:
            await store.close()

    return asyncio.run(search())


def test_offline_demo_then_sessions_show_rebuild(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = turnlog(home, "demo", "--scripted")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert out.splitlines()[0].startswith(
        "turnlog demo · model scripted-demo: a deterministic offline script"
    )
    assert "end_date must be YYYY-MM-DD" in out  # the argument correction reached the user
    assert "send_notification failed" in out and "[FAILED]" in out
    assert "PROCESSING → TOOL_WAIT" in out and "TOOL_LOOP → PROCESSING" in out
    assert "finished: answered · 4 tool iterations · 5 model calls" in out
    assert "1 could not be sent (customer C-105" in out  # the answer does not claim the failed send
    report = next((home / "reports").glob("*.md"))
    assert "failed: 1" in report.read_text()

    live = tables(home)
    (session,) = live["sessions"]
    sid = session["session_id"]
    assert session["current_state"] == "FINISHED" and session["turns"] == 1
    statuses = sorted(r["status"] for r in live["tool_calls"])
    assert statuses == ["failed", "rejected"] + ["success"] * 6

    listed = turnlog(home, "sessions")
    assert listed.returncode == 0 and sid in listed.stdout

    shown = turnlog(home, "show", sid)
    assert shown.returncode == 0
    assert (
        "state path IDLE → PROCESSING → TOOL_WAIT → PROCESSING → TOOL_LOOP → PROCESSING → TOOL_LOOP → "
        "PROCESSING → TOOL_LOOP → PROCESSING → FINISHED"
    ) in shown.stdout
    assert "query_orders" in shown.stdout and "rejected" in shown.stdout

    rebuilt = turnlog(home, "rebuild")
    assert rebuilt.returncode == 0
    assert f"rebuilt 1 sessions from {session['state_version']} events" in rebuilt.stdout
    assert tables(home) == live


def test_show_unknown_session_says_what_to_do(tmp_path: Path) -> None:
    run = turnlog(tmp_path / "home", "show", "nope")
    assert run.returncode == 1
    assert "no session nope" in run.stdout and "turnlog sessions" in run.stdout


def _endpoint_script(today: dt.date) -> list[FakeReply]:
    monday, sunday = last_week(today)
    query = json.dumps(
        {"start_date": monday.isoformat(), "end_date": sunday.isoformat(), "anomalies_only": True}
    )
    notify = [
        (
            f"call_n{i}",
            "send_notification",
            json.dumps({"customer_id": c, "order_id": o, "message": "Sorry for the delay."}),
        )
        for i, (c, o) in enumerate([("C-104", "O-1005"), ("C-105", "O-1008")])
    ]
    return [
        FakeReply(tool_calls=[("call_q", "query_orders", query)]),
        FakeReply(tool_calls=notify),
        FakeReply(
            tool_calls=[("call_r", "save_report", json.dumps({"title": "Anomalies", "body": "two orders"}))]
        ),
        FakeReply(text="Two customers affected; one notice could not be sent. The report is saved."),
        FakeReply(
            text=json.dumps([{"fact": "Anomaly reports go to the operations team", "tag": "agreement"}])
        ),
    ]


def test_demo_against_an_openai_compatible_endpoint(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with serve_openai(_endpoint_script(dt.date.today()), model="fake-model") as server:
        run = turnlog(home, "demo", "--base-url", server.base_url, "--model", "fake-model", "--api-key", "k")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == f"turnlog demo · model fake-model at {server.base_url}"
    assert "Two customers affected; one notice could not be sent." in run.stdout
    assert "finished: answered · 3 tool iterations · 4 model calls" in run.stdout

    first, *_, last, extraction = server.requests
    assert first["model"] == "fake-model" and first["stream"] is True
    assert first["messages"][0]["role"] == "system" and "Today is" in first["messages"][0]["content"]
    assert first["messages"][1] == {"role": "user", "content": first["messages"][1]["content"]}
    assert {t["function"]["name"] for t in first["tools"]} == {
        "query_orders",
        "send_notification",
        "save_report",
        "remember",  # the example agent has long-term memory (Qdrant local mode in HOME/memory)
    }
    assert "long-term memory" in extraction["messages"][0]["content"]  # the task's facts, after the turn
    assert "User: Find last week's orders" in extraction["messages"][1]["content"]
    assert remembered(home, "demo-user", "who gets the anomaly reports?") == [
        "Anomaly reports go to the operations team"
    ]
    tool_msgs = [m for m in last["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["call_q", "call_n0", "call_n1", "call_r"]
    assert tool_msgs[2]["content"].startswith("[FAILED] send_notification customer C-105")

    (session,) = tables(home)["sessions"]
    assert session["model_name"] == "fake-model" and session["input_tokens"] > 0


def _next_commands(output: str) -> list[list[str]]:
    """The commands printed after "Next:", split as a shell would."""
    block = output.split("Next:", 1)[1]
    return [shlex.split(line) for line in block.splitlines() if line.startswith("  ")]


def test_the_printed_hints_run_as_printed_and_a_fork_is_continued(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = turnlog(home, "demo", "--scripted")
    assert run.returncode == 0, run.stderr
    show, snapshots, sessions = _next_commands(run.stdout)
    assert show[-4:-2] == ["show", tables(home)["sessions"][0]["session_id"]] and show[-2:] == [
        "--home",
        str(home),
    ]
    for command in (show, snapshots, sessions):
        done = subprocess.run(
            command, capture_output=True, text=True, env=_env(), timeout=120, cwd=home.parent
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    listed = subprocess.run(snapshots, capture_output=True, text=True, env=_env(), timeout=120).stdout
    versions = [int(m.group(1)) for line in listed.splitlines() if (m := re.match(r"[│|\s]*(\d+)\s", line))]
    sid = show[-3]
    mid_turn = versions[1]  # after the first tool step: the fork inherits a running turn

    refused = turnlog(home, "fork", sid, str(mid_turn))  # mid-turn: the admin must say what happens
    assert refused.returncode == 2 and "unfinished='continue'" in refused.stdout
    forked = turnlog(home, "fork", sid, str(mid_turn), "--unfinished", "continue")
    assert forked.returncode == 0, forked.stderr
    assert "It inherited a turn that had not finished" in forked.stdout
    [go_on, show_fork] = _next_commands(forked.stdout)
    assert go_on[-4] == "continue"
    continued = subprocess.run(
        go_on, capture_output=True, text=True, env=_env(), timeout=120, cwd=home.parent
    )
    assert continued.returncode == 0, continued.stdout + continued.stderr
    assert "finished: answered" in continued.stdout and "send_notification" in continued.stdout
    fork_id = go_on[-3]
    (row,) = [r for r in tables(home)["sessions"] if r["session_id"] == fork_id]
    assert row["current_state"] == "FINISHED"

    again = turnlog(home, "continue", fork_id)
    assert again.returncode == 1 and "has no turn waiting" in again.stdout
    answered = turnlog(home, "continue", fork_id, "Thanks, that is all.", "--scripted")
    assert answered.returncode == 0 and "finished: answered" in answered.stdout


def test_sessions_fit_80_columns_with_whole_ids(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert turnlog(home, "demo", "--scripted").returncode == 0
    listed = turnlog(home, "sessions", columns=80)
    sid = tables(home)["sessions"][0]["session_id"]
    assert sid in listed.stdout and "FINISHED" in listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80


async def _session_with(home: Path, agent: Agent, text: str) -> str:
    app = EmbeddedApp(home, [agent])
    try:
        session = await app.api.create_session(agent.agent_id, "u")
        async for _ in app.api.send_user_message(session.session_id, text):
            pass
        return session.session_id
    finally:
        await app.close()


async def test_show_and_replay_print_the_corrections_and_why_a_session_failed(tmp_path: Path) -> None:
    home = tmp_path / "home"

    @tool(idempotent=True)
    def lookup(order_id: str) -> str:
        """Look an order up."""
        return f"{order_id} is delayed"

    def repeats(request: ModelRequest) -> str:
        told = next(m.content for m in reversed(request.messages) if m.role == "user")
        if told.startswith("These calls were already made"):
            return "A-17 is delayed."
        return '```json\n{"name": "lookup", "arguments": {"order_id": "A-17"}}\n```'

    def down(request: ModelRequest) -> str:
        raise ModelError("model endpoint http://127.0.0.1:9/v1 answered 503: overloaded")

    small = Agent.build("small", PromptToolsModel(FunctionModel(repeats, name="small")), [lookup])
    corrected = await _session_with(home, small, "Where is A-17?")
    failing = await _session_with(home, Agent.build("down", FunctionModel(down, name="down")), "hello")

    shown = turnlog(home, "show", corrected)
    assert shown.returncode == 0
    assert "correction · step 2, answer 1: calls already made: lookup" in shown.stdout
    assert "(not run again); told: These calls were already made" in shown.stdout
    replayed = turnlog(home, "replay", corrected)
    assert "ModelCorrected" in replayed.stdout and "calls already made: lookup" in replayed.stdout

    shown = turnlog(home, "show", failing)
    assert "state ERROR" in shown.stdout
    assert "error ModelError: model endpoint http://127.0.0.1:9/v1 answered 503: overloaded" in shown.stdout


def test_latencies_read_in_seconds_and_milliseconds() -> None:
    assert [duration(ms) for ms in (0.04, 85.4, 2300, 245_000)] == ["0.0 ms", "85 ms", "2.3 s", "4 min 05 s"]
