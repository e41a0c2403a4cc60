"""The tool-call ledger's key (engine/tools/ledger.py): derived from the call's place in the
log, filled by the engine into a tool that declares it, never shown to or set by the model.
The crash paths are in tests/test_recovery.py (SIGKILL) and tests/test_fault.py (Kafka)."""

from __future__ import annotations

import pytest

from turnlog.engine import tool
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.tools import ToolStatus
from turnlog.engine.tools.execute import execute, prepare
from turnlog.engine.tools.ledger import idempotency_key
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
