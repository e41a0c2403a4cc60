"""Permissions (seed §4.1): a session's role decides which tools exist for it. A user session
cannot run an admin tool by any route: model output, direct invocation, or a log replayed
into a fresh runner (recovery)."""

from __future__ import annotations

from typing import Any

from tests.tool_harness import of, open_session, since_user, tool_results
from turnlog.engine import FunctionModel, ModelRequest, ToolStatus, TurnRunner, call, reply, tool
from turnlog.engine import events as ev
from turnlog.engine.tools import ToolRegistry
from turnlog.engine.tools.permissions import tools_for_role

ran: list[str] = []


@tool(roles={"admin"}, sensitivity="high")
def purge_orders(region: str) -> str:
    """Delete every order of a region."""
    ran.append(f"purge {region}")
    return f"purged {region}"


@tool(idempotent=True)
def lookup(order_id: str) -> str:
    """Look up an order."""
    ran.append(f"lookup {order_id}")
    return f"{order_id}: delayed"


def asks_for(name: str, args: dict[str, Any]) -> FunctionModel:
    def fn(request: ModelRequest) -> Any:
        if not tool_results(since_user(request.messages)):
            return reply("", call(name, args, "c1"))
        return "done: " + request.messages[-1].content

    return FunctionModel(fn)


def setup_function() -> None:
    ran.clear()


def test_role_view_filters_and_empty_roles_mean_everyone() -> None:
    registry = ToolRegistry([purge_orders, lookup])
    assert tools_for_role(registry, "user").names == ["lookup"]
    assert tools_for_role(registry, "admin").names == ["purge_orders", "lookup"]
    assert tools_for_role(registry, "user") is tools_for_role(registry, "user"), "cached per role"


async def test_user_session_is_not_offered_the_admin_tool_and_its_call_is_an_unknown_tool(log: Any) -> None:
    s = await open_session(log, asks_for("purge_orders", {"region": "eu"}), [purge_orders, lookup])
    await s.send("delete all EU orders")
    offered = [spec["name"] for spec in s.model.requests[0].tools]
    assert offered == ["lookup"]
    (finished,) = of(await s.events(), ev.ToolCallFinished)
    assert finished.status == ToolStatus.REJECTED
    assert ran == []

    # the answer is exactly the one a name nobody registered gets
    s2 = await open_session(log, asks_for("teleport", {"region": "eu"}), [purge_orders, lookup])
    await s2.send("teleport")
    (unknown,) = of(await s2.events(), ev.ToolCallFinished)
    assert finished.content == unknown.content.replace("teleport", "purge_orders")
    assert finished.error == unknown.error.replace("teleport", "purge_orders")  # type: ignore[union-attr]
    assert "no such tool 'purge_orders'; available tools are: lookup." in finished.content


async def test_admin_session_sees_and_runs_the_admin_tool(log: Any) -> None:
    s = await open_session(
        log, asks_for("purge_orders", {"region": "eu"}), [purge_orders, lookup], role="admin"
    )
    await s.send("delete all EU orders")
    assert [spec["name"] for spec in s.model.requests[0].tools] == ["purge_orders", "lookup"]
    (finished,) = of(await s.events(), ev.ToolCallFinished)
    assert (finished.status, finished.content) == (ToolStatus.SUCCESS, "purged eu")
    assert ran == ["purge eu"]


async def test_direct_invocation_of_an_admin_tool_from_a_user_session_is_refused_and_logged(log: Any) -> None:
    s = await open_session(log, asks_for("lookup", {"order_id": "A"}), [purge_orders, lookup])
    outcome = await s.api.invoke_tool(s.sid, "purge_orders", {"region": "eu"}, actor="support-console")
    unknown = await s.api.invoke_tool(s.sid, "teleport", {"region": "eu"})
    assert outcome.status == ToolStatus.REJECTED
    assert outcome.content == unknown.content.replace("teleport", "purge_orders")
    assert ran == []
    invoked = of(await s.events(), ev.ToolInvoked)
    assert [(e.tool_name, e.status, e.actor) for e in invoked] == [
        ("purge_orders", "rejected", "support-console"),
        ("teleport", "rejected", "api"),
    ]


async def test_a_replayed_log_naming_an_admin_tool_does_not_run_it(log: Any) -> None:
    """A log in which a user session's turn asked for (and even started) the admin tool, as a
    crashed or forged writer could leave it: recovery folds it and still never runs the tool."""
    s = await open_session(log, asks_for("lookup", {"order_id": "A"}), [purge_orders, lookup])
    # build the log by hand: turn started, the model asked for purge_orders, a worker started it
    base = await log.session_version(s.sid)
    tid, mid = ev.new_id(), ev.new_id()
    common = {"session_id": s.sid, "correlation_id": tid}
    forged: list[ev.Event] = [
        ev.UserMessageReceived(version=base + 1, message_id=mid, text="purge", session_id=s.sid),
        ev.TurnStarted(version=base + 2, turn_id=tid, message_id=mid, **common),
        ev.StateChanged(
            version=base + 3, from_state="IDLE", to_state="PROCESSING", cause="user_message", **common
        ),
        ev.ModelCallStarted(
            version=base + 4, turn_id=tid, step=0, model="m", message_count=1, tools_offered=1, **common
        ),
        ev.ModelCallFinished(version=base + 5, turn_id=tid, step=0, model="m", status="ok", **common),
        ev.AssistantMessage(
            version=base + 6,
            turn_id=tid,
            message_id=ev.new_id(),
            text="",
            tool_calls=(ev.ToolCallSpec("c1", "purge_orders", '{"region": "eu"}'),),
            **common,
        ),
        ev.ToolCallRequested(
            version=base + 7,
            turn_id=tid,
            call_id="c1",
            tool_name="purge_orders",
            arguments_json='{"region": "eu"}',
            iteration=1,
            **common,
        ),
        ev.StateChanged(
            version=base + 8, from_state="PROCESSING", to_state="TOOL_WAIT", cause="model_tool_call", **common
        ),
        ev.ToolCallStarted(version=base + 9, turn_id=tid, call_id="c1", tool_name="purge_orders", **common),
    ]
    await log.append(forged, expected_version=base)
    fresh = TurnRunner(log, lambda _: s.agent, producer="successor")
    _ = [item async for item in fresh.run(s.sid)]
    finished = of(await s.events(), ev.ToolCallFinished)
    assert [(f.call_id, f.status) for f in finished] == [("c1", "rejected")]
    assert "no such tool 'purge_orders'" in finished[0].content
    assert ran == []
