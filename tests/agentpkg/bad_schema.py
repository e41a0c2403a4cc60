"""A tool whose JSON Schema does not compile: loading this module is a configuration error."""

from turnlog.engine import AgentDirectory, Tool

from .good import agent

BROKEN = Tool(
    name="broken",
    description="A schema with a type that does not exist.",
    parameters={"type": "object", "properties": {"n": {"type": "integer-ish"}}},
    handler=lambda n: n,
)
directory = AgentDirectory([agent()])
