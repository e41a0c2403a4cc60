"""MCP tools against real reference servers (installed by scripts/test.sh with `npm ci` from
tests/mcp/package-lock.json): the `everything` server over stdio and over streamable HTTP, and
the `filesystem` server over stdio. Discovery, calls, validation, permissions, approvals,
timeouts and error results all go through the ordinary turn loop and land on the log."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.tool_harness import of, open_session, since_user, tool_results
from turnlog.engine import FunctionModel, ModelRequest, SqliteEventLog, ToolStatus, call, reply
from turnlog.engine import events as ev
from turnlog.engine.tools.mcp import McpToolset, ToolPolicy

SERVERS = Path(__file__).resolve().parent / "mcp" / "node_modules" / "@modelcontextprotocol"
EVERYTHING = str(SERVERS / "server-everything" / "dist" / "index.js")
FILESYSTEM = str(SERVERS / "server-filesystem" / "dist" / "index.js")
NODE = shutil.which("node") or "node"

if not Path(EVERYTHING).exists():  # pragma: no cover - scripts/test.sh installs them
    raise RuntimeError("MCP test servers are missing: run ./scripts/test.sh (it runs npm ci in tests/mcp)")


def script(*steps: Any) -> FunctionModel:
    """Step i of the turn asks for steps[i] (a tool call), then the model summarises."""

    def fn(request: ModelRequest) -> Any:
        done = len(tool_results(since_user(request.messages)))
        if done < len(steps):
            return reply("", steps[done])
        return "results: " + " | ".join(m.content for m in tool_results(since_user(request.messages)))

    return FunctionModel(fn)


@pytest.fixture
async def everything() -> AsyncIterator[McpToolset]:
    policies = {
        "get-annotated-message": ToolPolicy(roles={"admin"}, sensitivity="high"),  # type: ignore[arg-type]
        "trigger-long-running-operation": ToolPolicy(timeout_s=1.0),
    }
    async with McpToolset.stdio(NODE, [EVERYTHING, "stdio"], policies=policies) as toolset:
        yield toolset


async def test_stdio_tools_are_listed_with_their_schemas(everything: McpToolset) -> None:
    by_name = {t.name: t for t in everything.tools}
    assert {"echo", "get-sum", "get-annotated-message", "trigger-long-running-operation"} <= set(by_name)
    schema = by_name["get-sum"].parameters
    assert schema["properties"]["a"]["type"] == "number" and schema["required"] == ["a", "b"]
    assert by_name["get-sum"].description == "Returns the sum of two numbers"
    assert by_name["get-annotated-message"].roles == {"admin"}


async def test_stdio_calls_run_through_the_turn_loop(log: SqliteEventLog, everything: McpToolset) -> None:
    model = script(call("get-sum", {"a": 2, "b": 3}, "s1"), call("echo", {"message": "héllo"}, "e1"))
    s = await open_session(log, model, everything.tools)
    await s.send("add and echo")
    offered = {spec["name"]: spec for spec in model.requests[0].tools}
    assert offered["get-sum"]["parameters"] == dict(
        everything.tools[[t.name for t in everything.tools].index("get-sum")].parameters
    )
    assert "get-annotated-message" not in offered, "a user session is not offered the admin-only tool"
    finished = of(await s.events(), ev.ToolCallFinished)
    assert [(f.status, f.content) for f in finished] == [
        (ToolStatus.SUCCESS, "The sum of 2 and 3 is 5."),
        (ToolStatus.SUCCESS, "Echo: héllo"),
    ]
    assert (await s.history())[-1].content == "results: The sum of 2 and 3 is 5. | Echo: héllo"


async def test_mcp_arguments_are_validated_before_the_server_sees_them(
    log: SqliteEventLog, everything: McpToolset
) -> None:
    model = script(call("get-sum", {"a": "two", "b": 3}, "bad"), call("get-sum", {"a": 2}, "short"))
    s = await open_session(log, model, everything.tools)
    await s.send("add")
    events = await s.events()
    finished = of(events, ev.ToolCallFinished)
    assert [f.status for f in finished] == ["rejected", "rejected"]
    assert "a must be a number, got 'two'" in finished[0].content
    assert "missing required argument b (a number); arguments you sent: a" in finished[1].content
    assert of(events, ev.ToolCallStarted) == [], "nothing reached the server"


async def test_mcp_admin_tool_is_unknown_to_a_user_session(
    log: SqliteEventLog, everything: McpToolset
) -> None:
    asked = call("get-annotated-message", {"messageType": "success"}, "m")
    s = await open_session(log, script(asked), everything.tools)
    await s.send("annotate")
    (finished,) = of(await s.events(), ev.ToolCallFinished)
    assert finished.status == "rejected" and "no such tool 'get-annotated-message'" in finished.content
    assert of(await s.events(), ev.ToolCallStarted) == []
    admin = await open_session(log, script(asked), everything.tools, role="admin")
    await admin.send("annotate")
    (ran,) = of(await admin.events(), ev.ToolCallFinished)
    assert ran.status == "success" and "success" in ran.content.lower()


async def test_mcp_call_past_its_timeout_is_a_result_the_model_sees(
    log: SqliteEventLog, everything: McpToolset
) -> None:
    model = script(call("trigger-long-running-operation", {"duration": 30, "steps": 30}, "slow"))
    s = await open_session(log, model, everything.tools)
    await s.send("run the long thing")
    (finished,) = of(await s.events(), ev.ToolCallFinished)
    assert finished.status == ToolStatus.TIMEOUT
    assert finished.content.startswith(
        "[FAILED: TIMEOUT] trigger-long-running-operation did not finish within 1 s"
    )
    # the connection is still usable after the cancelled call
    s2 = await open_session(log, script(call("echo", {"message": "still here"}, "e")), everything.tools)
    await s2.send("echo")
    assert of(await s2.events(), ev.ToolCallFinished)[0].content == "Echo: still here"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the MCP HTTP server exited with {proc.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_streamable_http_server(log: SqliteEventLog) -> None:
    port = free_port()
    env = {**os.environ, "PORT": str(port)}
    proc = subprocess.Popen(
        [NODE, EVERYTHING, "streamableHttp"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await wait_for_port(port, proc)
        async with McpToolset.http(
            f"http://127.0.0.1:{port}/mcp", include={"echo", "get-sum"}, prefix="everything_"
        ) as remote:
            assert sorted(t.name for t in remote.tools) == ["everything_echo", "everything_get-sum"]
            model = script(call("everything_get-sum", {"a": 40, "b": 2}, "s"))
            s = await open_session(log, model, remote.tools)
            await s.send("40 + 2?")
            (finished,) = of(await s.events(), ev.ToolCallFinished)
            assert (finished.status, finished.content) == ("success", "The sum of 40 and 2 is 42.")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_filesystem_server_write_needs_approval_and_errors_are_failures(
    log: SqliteEventLog, tmp_path: Path
) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("first line\n")
    policies = {
        "write_file": ToolPolicy(requires_approval=True, sensitivity="high"),  # type: ignore[arg-type]
        "read_text_file": ToolPolicy(idempotent=True),
    }
    async with McpToolset.stdio(NODE, [FILESYSTEM, str(root)], policies=policies) as fs:
        names = {t.name for t in fs.tools}
        assert {"read_text_file", "write_file", "list_directory"} <= names
        model = script(
            call("read_text_file", {"path": str(root / "notes.txt")}, "r1"),
            call("read_text_file", {"path": "/etc/passwd"}, "r2"),
            call("write_file", {"path": str(root / "report.txt"), "content": "all good"}, "w1"),
        )
        s = await open_session(log, model, fs.tools)
        await s.send("read, then write the report")
        state = await s.api.get_state(s.sid)
        assert [c.tool_name for c in state.pending_approvals] == ["write_file"]
        assert not (root / "report.txt").exists()
        await s.decide("w1", "approve")
        assert (root / "report.txt").read_text() == "all good"
    finished = of(await s.events(), ev.ToolCallFinished)
    assert [(f.call_id, f.status) for f in finished] == [
        ("r1", "success"),
        ("r2", "failed"),
        ("w1", "success"),
    ]
    assert finished[0].content == "first line\n" or "first line" in finished[0].content
    assert (
        finished[1].content.startswith("[FAILED] read_text_file") and "denied" in finished[1].content.lower()
    )


async def test_configuration_mistakes_are_named() -> None:
    from turnlog.engine import ConfigurationError

    with pytest.raises(ConfigurationError, match="has no tool ech0; it lists: echo"):
        async with McpToolset.stdio(
            NODE, [EVERYTHING, "stdio"], include={"echo"}, policies={"ech0": ToolPolicy()}
        ):
            pass
    with pytest.raises(ConfigurationError, match="cannot connect to MCP server http://127.0.0.1:"):
        async with McpToolset.http(f"http://127.0.0.1:{free_port()}/mcp"):
            pass
