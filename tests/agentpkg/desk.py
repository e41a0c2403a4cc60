"""A help desk's agent for the gateway-on-Kafka tests, loaded by `turnlog serve --agents
tests.agentpkg.desk:directory` and run by a worker in the test: a lookup, then an answer streamed
in small chunks; a message that asks for a refund gets a refund call that waits for approval."""

from __future__ import annotations

from typing import Any

from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    call,
    reply,
    tool,
)

REFUNDS: list[dict[str, Any]] = []
"""What the refund tool ran with, in this process."""
ANSWER = "Order A-17 is delayed by two days."


@tool(idempotent=True)
def lookup(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"order_id": order_id, "status": "delayed"}


@tool(requires_approval=True, sensitivity="high")
def refund(order_id: str, amount: int) -> str:
    """Refund an order (waits for the user's approval)."""
    REFUNDS.append({"order_id": order_id, "amount": amount})
    return f"refunded {amount} on {order_id}"


def answer(request: ModelRequest) -> ModelResponse | str:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    asked = request.messages[last_user].content.lower()
    results = [m for m in request.messages[last_user + 1 :] if m.role == "tool"]
    if results:
        return ANSWER if "refund" not in asked else "Done: " + results[-1].content
    if "refund" in asked:
        return reply("", call("refund", {"order_id": "A-17", "amount": 40}, f"refund-{last_user}"))
    return reply("", call("lookup", {"order_id": "A-17"}, f"lookup-{last_user}"))


def directory() -> AgentDirectory:
    return AgentDirectory(
        [Agent.build("desk", FunctionModel(answer, name="desk-model", chunk_chars=4), [lookup, refund])]
    )
