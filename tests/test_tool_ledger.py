"""The tool-call ledger's key (engine/tools/ledger.py): derived from the call's place in the
log, filled by the engine into a tool that declares it, never shown to or set by the model; a
tool whose flag and handler disagree about it, or whose lookup cannot ask about it, is refused
when built. The crash paths are in tests/test_tool_crashes.py, tests/test_tool_crash_storm.py
and tests/test_recovery.py (SIGKILL), and tests/test_fault.py (Kafka)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tool_harness import open_session
from turnlog.engine import FunctionModel, SqliteEventLog, Tool, call, reply, tool
from turnlog.engine import events as ev
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.tools import ToolStatus
from turnlog.engine.tools.execute import execute, prepare
from turnlog.engine.tools.ledger import NOT_APPLIED, idempotency_key
from turnlog.engine.tools.registry import ToolRegistry

seen: list[str] = []


@tool(idempotent=True, retries=2)
def charge(amount: int, idempotency_key: str) -> str:
    """Charge the customer (the payment API deduplicates by the key)."""
    seen.append(idempotency_key)
    if len(seen) < 3:
        raise ConnectionError("the payment API dropped the connection")
    return f"charged {amount}"


def test_the_key_is_stable_per_call_and_distinct_between_calls() -> None:
    key = idempotency_key("s-1", "turn-1", "call_0")
    assert key == idempotency_key("s-1", "turn-1", "call_0") and len(key) == 64
    others = {idempotency_key("s-1", "turn-2", "call_0"), idempotency_key("s-2", "turn-1", "call_0")}
    assert key not in others and len(others) == 2  # models reuse call ids across turns


def test_the_model_neither_sees_nor_sets_the_key() -> None:
    assert set(charge.parameters["properties"]) == {"amount"} and charge.takes_idempotency_key
    refused = prepare(ToolRegistry([charge]), "charge", '{"amount": 5, "idempotency_key": "mine"}')
    assert getattr(refused, "status", None) == ToolStatus.REJECTED


async def test_every_attempt_of_a_call_gets_its_key() -> None:
    seen.clear()
    outcome = await execute(charge, {"amount": 5}, idempotency_key="k-1")
    assert (outcome.status, outcome.attempts, seen) == (ToolStatus.SUCCESS, 3, ["k-1"] * 3)


def test_a_key_parameter_must_be_a_string() -> None:
    def wrong(idempotency_key: int) -> str:
        return ""

    with pytest.raises(ConfigurationError, match="filled by the engine and must be typed str"):
        tool(wrong)


SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}


def test_a_json_schema_tool_whose_handler_wants_the_key_without_the_flag_is_refused() -> None:
    def pay(amount: int, idempotency_key: str) -> str:
        return f"paid {amount}"

    with pytest.raises(ConfigurationError, match="pass takes_idempotency_key=True") as refused:
        Tool(name="pay", description="Pay.", parameters=SCHEMA, handler=pay)
    assert "tool pay: its handler declares 'idempotency_key'" in str(refused.value)


def test_the_flag_on_a_handler_that_cannot_take_the_key_is_refused() -> None:
    def pay(amount: int) -> str:
        return f"paid {amount}"

    with pytest.raises(ConfigurationError, match="takes_idempotency_key=True but its handler has no"):
        Tool(name="pay", description="Pay.", parameters=SCHEMA, handler=pay, takes_idempotency_key=True)
    with_key = {**SCHEMA, "properties": {**SCHEMA["properties"], "idempotency_key": {"type": "string"}}}
    with pytest.raises(ConfigurationError, match="the engine fills it: remove it from the schema"):
        Tool(
            name="pay",
            description="Pay.",
            parameters=with_key,
            handler=lambda **kw: kw,
            takes_idempotency_key=True,
        )


async def test_a_json_schema_tool_with_the_flag_gets_its_calls_key(tmp_path: Path) -> None:
    """Built the documented way, the tool runs in a turn and gets the key on the log."""
    got: list[str] = []

    async def pay(amount: int, idempotency_key: str) -> str:
        got.append(idempotency_key)
        return f"paid {amount}"

    paying = Tool(name="pay", description="Pay.", parameters=SCHEMA, handler=pay, takes_idempotency_key=True)
    model = FunctionModel(lambda r: reply("", call("pay", {"amount": 5})) if len(r.messages) == 1 else "done")
    log = SqliteEventLog(tmp_path / "log.db")
    try:
        session = await open_session(log, model, [paying])
        await session.send("pay it")
        (started,) = await session.of(ev.ToolCallStarted)
        (done,) = await session.of(ev.ToolCallFinished)
    finally:
        await log.close()
    assert got == [started.idempotency_key] and (done.status, done.content) == ("success", "paid 5")


def test_a_lookup_is_checked_when_the_tool_is_built() -> None:
    def lookup(key: str) -> object:
        return NOT_APPLIED

    with pytest.raises(
        ConfigurationError, match="lookup= asks about a call's idempotency key, and this tool takes none"
    ):
        tool(lookup=lookup)(_keyless)
    with pytest.raises(ConfigurationError, match="lookup must take the key as its one argument"):
        tool(lookup=lambda: None)(_keyed)
    with pytest.raises(ConfigurationError, match="lookup must be a function of the key"):
        tool(lookup="booked")(_keyed)  # type: ignore[arg-type]
    assert tool(lookup=lookup)(_keyed).lookup is lookup


def _keyless(ref: str) -> str:
    """Book without a key."""
    return ref


def _keyed(ref: str, idempotency_key: str) -> str:
    """Book with a key."""
    return ref
