"""Tools from Model Context Protocol servers, through the official ``mcp`` SDK.

``McpToolset`` connects to one server (a command over stdio, or a streamable HTTP URL), lists
its tools with their JSON Schemas when it connects, and turns each into an ordinary ``Tool``:
the model sees the server's name, description and schema, and every call goes through the same
role filter, validation, approval, timeout, retry, guards, shaping and events as a Python tool.
Per-tool policy (roles, sensitivity, approval, timeout, idempotency) is set by the deployment,
since a server cannot be trusted to declare its own permissions.

A server's error result (``isError``) becomes a ``ToolFailure`` (a ``[FAILED]`` result the
model sees); structured content is the result when present, else the text blocks joined, with
non-text blocks described in one line each.

Use it as an async context manager around the agent's lifetime, entered and left in the same
task (the SDK's transports are anyio task groups)::

    async with McpToolset.stdio("node", ["server.js", "stdio"]) as everything:
        agent = Agent.build("helper", model, [*local_tools, *everything.tools])
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Mapping

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from ..errors import ConfigurationError, ToolFailure
from .registry import DEFAULT_MAX_RESULT_CHARS, DEFAULT_TIMEOUT_S, Handler, Sensitivity, Tool


@dataclass(frozen=True)
class ToolPolicy:
    """What the deployment decides about a server's tool."""

    roles: frozenset[str] = frozenset()
    sensitivity: Sensitivity = Sensitivity.LOW
    requires_approval: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    idempotent: bool = False
    retries: int | None = None
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS

    def __post_init__(self) -> None:  # accept {"admin"} and "high" as well
        object.__setattr__(self, "roles", frozenset(self.roles))
        object.__setattr__(self, "sensitivity", Sensitivity(self.sensitivity))


class McpToolset:
    """The tools of one MCP server, listed on connect."""

    def __init__(
        self,
        server: StdioServerParameters | str,
        *,
        prefix: str = "",
        include: Iterable[str] | None = None,
        policies: Mapping[str, ToolPolicy] | None = None,
        default_policy: ToolPolicy = ToolPolicy(),
    ) -> None:
        self.server = server
        self.prefix = prefix
        self.include = frozenset(include) if include is not None else None
        self.policies = dict(policies or {})
        self.default_policy = default_policy
        self.tools: list[Tool] = []
        """The server's tools as turnlog tools (empty until connected)."""
        self._client: Client | None = None
        self._holder: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Iterable[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        **options: Any,
    ) -> McpToolset:
        params = StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env is not None else None, cwd=cwd
        )
        return cls(params, **options)

    @classmethod
    def http(cls, url: str, **options: Any) -> McpToolset:
        """A server over streamable HTTP, e.g. ``http://127.0.0.1:3001/mcp``."""
        return cls(url, **options)

    async def __aenter__(self) -> McpToolset:
        # the SDK's client lives in anyio task groups that must be entered and left by one task;
        # a task of our own holds it, so the toolset may be opened and closed from any task
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[list[Tool]] = loop.create_future()
        self._stop = asyncio.Event()
        self._holder = asyncio.create_task(self._hold(ready), name=f"mcp {self.describe()}")
        try:
            self.tools = await ready
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        holder, self._holder = self._holder, None
        if holder is None:
            return
        self._stop.set()
        try:
            await holder
        except Exception:  # the connection failed while closing; there is nothing left to clean
            pass

    async def _hold(self, ready: asyncio.Future[list[Tool]]) -> None:
        try:
            async with Client(self.server) as client:
                self._client = client
                tools = await self._list(client)
                self._check_policies(tools)
                ready.set_result(tools)
                await self._stop.wait()
        except Exception as exc:
            if ready.done():
                raise
            if isinstance(exc, ConfigurationError):
                ready.set_exception(exc)
            else:
                ready.set_exception(
                    ConfigurationError(f"cannot connect to MCP server {self.describe()}: {_reason(exc)}")
                )
        finally:
            self._client = None

    def _check_policies(self, tools: list[Tool]) -> None:
        unknown = set(self.policies) - {t.name[len(self.prefix) :] for t in tools}
        if unknown:
            raise ConfigurationError(
                f"MCP server {self.describe()} has no tool {', '.join(sorted(unknown))}; "
                f"it lists: {', '.join(t.name for t in tools) or 'none'}"
            )

    def describe(self) -> str:
        if isinstance(self.server, str):
            return self.server
        return " ".join([self.server.command, *self.server.args])

    async def _list(self, client: Client) -> list[Tool]:
        listed: list[Any] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        tools = []
        for spec in listed:
            if self.include is not None and spec.name not in self.include:
                continue
            tools.append(self._tool(spec))
        return tools

    def _tool(self, spec: Any) -> Tool:
        policy = self.policies.get(spec.name, self.default_policy)
        return Tool(
            name=self.prefix + spec.name,
            description=spec.description or spec.title or spec.name,
            parameters=dict(spec.input_schema),
            handler=self._handler(spec.name),
            timeout_s=policy.timeout_s,
            idempotent=policy.idempotent,
            roles=policy.roles,
            sensitivity=policy.sensitivity,
            requires_approval=policy.requires_approval,
            retries=policy.retries,
            max_result_chars=policy.max_result_chars,
        )

    def _handler(self, remote_name: str) -> Handler:
        async def call_remote(**arguments: Any) -> Any:
            client = self._client
            if client is None:
                raise ToolFailure(f"the MCP server {self.describe()} is not connected")
            result = await client.call_tool(remote_name, arguments)
            text = render_content(result.content)
            if result.is_error:
                raise ToolFailure(text or "the MCP server reported an error without details")
            if result.structured_content is not None:
                return result.structured_content
            return text

        return call_remote


def _reason(exc: BaseException) -> str:
    """The innermost message of an error, also out of the SDK's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def render_content(blocks: Iterable[Any]) -> str:
    """MCP content blocks as text: text as is, other blocks as a one-line description."""
    parts = []
    for block in blocks:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.name}: {block.uri}]")
        elif kind == "resource":
            inner = block.resource
            body = getattr(inner, "text", None)
            parts.append(body if body is not None else f"[resource {inner.uri}]")
        else:
            parts.append(f"[{kind or type(block).__name__} content]")
    return "\n".join(parts)
