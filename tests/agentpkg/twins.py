"""Two agents with one id: loading this module is a configuration error."""

from turnlog.engine import AgentDirectory

from .good import agent

directory = AgentDirectory([agent("twin"), agent("twin")])
