"""Agents that load: ``directory`` (an AgentDirectory), ``build`` (a function of the context),
``build_plain`` (a function of nothing)."""

from __future__ import annotations

from typing import Any

from turnlog.engine import (
    Agent,
    AgentDirectory,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    Tool,
    call,
    reply,
)


def stock(sku: str) -> dict[str, Any]:
    return {"sku": sku, "in_stock": 3}


STOCK = Tool(
    name="stock",
    description="How many of a product are in stock.",
    parameters={"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
    handler=stock,
    idempotent=True,
)


def answer(request: ModelRequest) -> ModelResponse | str:
    if request.messages[-1].role == "tool":
        return "In stock: " + request.messages[-1].content
    return reply("", call("stock", {"sku": "P-1"}))


def agent(agent_id: str = "shop") -> Agent:
    return Agent.build(agent_id, FunctionModel(answer, name="shop-model"), [STOCK], max_tool_iterations=3)


directory = AgentDirectory([agent()])


def build(context: Any) -> AgentDirectory:
    """Gets the program's context: the home folder and the model settings."""
    return AgentDirectory([agent(f"shop-{context.program}")])


def build_plain() -> AgentDirectory:
    return AgentDirectory([agent("plain")])


not_a_directory = [agent()]
empty = AgentDirectory()
