"""A shop's support agent: your code, loaded by turnlog's programs with
``--agents my_agents.agents:directory`` (or TURNLOG_AGENTS, or ``agents = ...`` in turnlog.toml).

It shows the three ways to give an agent tools (a typed function, a JSON Schema and a callable,
a call that waits for approval), a model from the program's settings, and long-term memory on a
Qdrant server. turnlog calls ``directory(context)`` once per process; everything the agent needs
(clients, stores) is built here.
"""

from __future__ import annotations

import os
from typing import Any

from turnlog.engine import (
    NOT_APPLIED,
    Agent,
    AgentDirectory,
    FunctionModel,
    MemoryPolicy,
    Model,
    ModelRequest,
    ModelResponse,
    Tool,
    call,
    reply,
    tool,
)

ORDERS = {"A-17": {"status": "delayed", "carrier": "DHL", "amount": 40}}


@tool(idempotent=True)  # a typed function: the JSON Schema comes from the type hints
async def order_status(order_id: str) -> dict[str, Any]:
    """Look an order up: status and carrier."""
    order = ORDERS.get(order_id)
    return {"order_id": order_id, **order} if order else {"order_id": order_id, "status": "unknown"}


def _carrier_rates(origin: str, weight_kg: float) -> list[dict[str, Any]]:
    # a plain def runs in a worker thread: a timeout stops waiting for it, but cannot stop it
    return [{"carrier": c, "price": round(5 + weight_kg * r, 2)} for c, r in (("DHL", 1.5), ("SF", 1.2))]


CARRIER_RATES = Tool(  # a JSON Schema and a callable: for tools described elsewhere (an API spec)
    name="carrier_rates",
    description="Shipping prices from an origin city for a parcel's weight.",
    parameters={
        "type": "object",
        "properties": {"origin": {"type": "string"}, "weight_kg": {"type": "number", "exclusiveMinimum": 0}},
        "required": ["origin", "weight_kg"],
        "additionalProperties": False,
    },
    handler=_carrier_rates,
    idempotent=True,
    timeout_s=5,
)


REFUNDS: dict[str, str] = {}
"""Stands in for the payment API's record of the refunds it made, by idempotency key."""


def refund_made(idempotency_key: str) -> str:
    """What the payment API says of a key: the refund made with it, or NOT_APPLIED. After a
    crash the engine asks this before running the call again or giving it up."""
    return REFUNDS.get(idempotency_key, NOT_APPLIED)


# waits in PAUSED_FOR_USER for approve / edit / reject
@tool(requires_approval=True, sensitivity="high", lookup=refund_made)
def refund(order_id: str, amount: float, idempotency_key: str) -> str:
    """Refund part or all of an order."""
    # idempotency_key is filled by the engine (the model never sees it): pass it to the payment API,
    # which makes one refund per key
    return REFUNDS.setdefault(idempotency_key, f"refunded {amount:.2f} on {order_id}")


def scripted(request: ModelRequest) -> ModelResponse | str:
    """A stand-in when no model endpoint is configured: looks the order up, then answers."""
    if request.messages[-1].role == "tool":
        return f"Here is what I found: {request.messages[-1].content}"
    return reply("Let me check.", call("order_status", {"order_id": "A-17"}))


def directory(context: Any) -> AgentDirectory:
    """turnlog's ``AgentContext``: ``context.settings`` is the endpoint the program was given
    (--base-url/--model, TURNLOG_BASE_URL/TURNLOG_MODEL), ``context.home`` its data folder."""
    model: Model = (
        context.settings.build()
        if context.settings.configured
        else FunctionModel(scripted, name="shop-scripted")
    )
    return AgentDirectory(
        [
            Agent.build(
                "shop-support",
                model,
                [order_status, CARRIER_RATES, refund],
                system_prompt="You help the shop's customers with their orders. Be brief.",
                max_tool_iterations=4,
                memory=_memory(model if context.settings.configured else None),
            )
        ]
    )


def _memory(extractor: Model | None) -> MemoryPolicy | None:
    """Long-term memory on the Qdrant server named by TURNLOG_QDRANT_URL (none without it)."""
    url = os.environ.get("TURNLOG_QDRANT_URL")
    if not url:
        return None
    from turnlog.engine.memory.qdrant import QdrantMemoryStore

    return MemoryPolicy(QdrantMemoryStore(url=url), extractor=extractor)
