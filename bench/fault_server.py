"""A fault-injecting OpenAI-compatible chat-completions server on loopback, for tests and benchmarks.

It speaks what the test fake (tests/openai_server.py) speaks: streamed ``chat.completion.chunk``
events with text and tool calls, a usage chunk, ``[DONE]``, OpenAI-style error bodies. It is
built like lean_model_server.py (raw asyncio HTTP/1.1 with keep-alive, answers prepared once),
not on Starlette, because a benchmark of hundreds of sessions must measure turnlog and not the
fake: the Starlette fake costs about as much CPU per call as the client.

Faults are set per model name (``"*"``: every model), live, from the process that runs the
server (``server.set("primary", hang=True)``) or over HTTP (``POST /faults`` with
``{"model": ..., "faults": {...}}``; ``GET /stats`` answers the counts):

* ``latency_s``: the wait before the first byte of every answer;
* ``hang``: requests get nothing (no status line) until the fault is cleared, then their answer;
* ``status`` (+ ``retry_after_s``): every request is answered with this error (500, 503, 429);
* ``cut_after_chunks``: the answer streams this many chunks, then the connection is cut;
* ``token_delay_s``: slow tokens, a wait between the answer's chunks;
* ``requests_per_s``: a provider's rate limit, at most this many requests in any second; the
  ones beyond get a 429 with ``retry-after``, ``retry-after-ms`` and ``x-ratelimit-*`` headers
  saying when the oldest request of the window leaves it (refused requests do not count).

    PYTHONPATH=. .venv/bin/python bench/fault_server.py --port 8090 --latency 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable

from bench.lean_model_server import ANSWER, _chunk, _content_length, _usage

ToolCall = tuple[str, str, str]
"""(call id, function name, arguments JSON)."""
Answer = tuple[str, list[ToolCall]]
AnswerFor = Callable[[dict[str, Any]], Answer]


@dataclass(frozen=True)
class Faults:
    latency_s: float = 0.0
    hang: bool = False
    status: int | None = None
    retry_after_s: float | None = None
    cut_after_chunks: int | None = None
    token_delay_s: float = 0.0
    requests_per_s: float | None = None


def lean_plan(body: dict[str, Any]) -> Answer:
    """The production benchmark's turn: ``lookup``, then ``notify``, then a text answer, by the
    tool results after the last user message."""
    messages = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    results = sum(1 for m in messages[last_user + 1 :] if m["role"] == "tool")
    if results < 2 and body.get("tools"):
        name = ("lookup", "notify")[results]
        return "", [(f"call_{name}", name, '{"order_id": "A-1"}')]
    return ANSWER, []


def answer_chunks(text: str, calls: list[ToolCall], model: str) -> list[dict[str, Any]]:
    """The chunks of a streamed answer, in the order OpenAI sends them."""
    chunks = [_named(_chunk({"role": "assistant", "content": "" if text or not calls else None}), model)]
    chunks += [_named(_chunk({"content": text[i : i + 8]}), model) for i in range(0, len(text), 8)]
    for index, (call_id, name, arguments) in enumerate(calls):
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        chunks.append(_named(_chunk({"tool_calls": [head]}), model))
        fragment = {"index": index, "function": {"arguments": arguments}}
        chunks.append(_named(_chunk({"tool_calls": [fragment]}), model))
    chunks.append(_named(_chunk({}, "tool_calls" if calls else "stop"), model))
    chunks.append(_named(_usage(60, max(1, len(text) // 4 + 8 * len(calls))), model))
    return chunks


def _named(chunk: dict[str, Any], model: str) -> dict[str, Any]:
    chunk["model"] = model
    return chunk


def _event(chunk: dict[str, Any] | str) -> bytes:
    data = chunk if isinstance(chunk, str) else json.dumps(chunk, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _response(status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> bytes:
    reason = {200: "OK", 204: "No Content", 404: "Not Found", 429: "Too Many Requests"}.get(status, "Error")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n{extra}"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> bytes:
    kind = "requests" if status == 429 else "server_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
    return _response(status, body.encode(), "application/json", headers)


def rate_limit_headers(wait_s: float, limit: float) -> dict[str, str]:
    """What OpenAI sends with a 429: when to come back, in every form clients read."""
    return {
        "retry-after": str(max(1, math.ceil(wait_s))),
        "retry-after-ms": str(max(1, round(wait_s * 1000))),
        "x-ratelimit-limit-requests": str(int(limit)),
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": f"{max(1, round(wait_s * 1000))}ms",
    }


class FaultServer:
    """The server and its faults; ``async with`` serves it on 127.0.0.1 in the running loop."""

    def __init__(self, answer: AnswerFor = lean_plan, *, port: int = 0, keep_bodies: bool = False) -> None:
        self.answer = answer
        self.port = port
        self.keep_bodies = keep_bodies
        self.bodies: list[dict[str, Any]] = []
        """The chat requests received, in order (with ``keep_bodies``)."""
        self.stats: dict[str, Counter[str]] = {}
        """Per model: requests, answered, rate_limited, errors, hung, cut."""
        self._faults: dict[str, Faults] = {}
        self._healed: dict[str, asyncio.Event] = {}
        self._windows: dict[str, deque[float]] = {}
        self._server: asyncio.Server | None = None
        self._prepared: dict[tuple[str, str], bytes] = {}
        self._connections: set[asyncio.StreamWriter] = set()
        self.accepted = 0
        """TCP connections accepted so far (a client reusing kept-alive ones opens no more)."""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def set(self, model: str = "*", **faults: Any) -> None:
        """Replace ``model``'s faults (``"*"``: the default for every model without its own)."""
        self._faults[model] = Faults(**faults)
        event = self._healed.setdefault(model, asyncio.Event())
        if self._faults[model].hang:
            event.clear()
        else:
            event.set()

    def clear(self, model: str = "*") -> None:
        self.set(model)

    def faults(self, model: str) -> Faults:
        return self._faults.get(model) or self._faults.get("*") or Faults()

    def count(self, model: str, what: str = "requests") -> int:
        return self.stats.get(model, Counter())[what]

    async def __aenter__(self) -> FaultServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, backlog=4096)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        for event in self._healed.values():
            event.set()  # hung requests end, so their connections close
        self._server.close()
        for writer in list(self._connections):  # kept-alive ones too: nothing is left open
            writer.transport.abort()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        self.accepted += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = _content_length(lines[1:])
                body = await reader.readexactly(length) if length else b""
                if not await self._route(method, path, body, writer):
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection was cut."""
        if path.endswith("/chat/completions") and method == "POST":
            return await self._chat(json.loads(body), writer)
        if path.endswith("/faults") and method == "POST":
            order = json.loads(body)
            self.set(order.get("model", "*"), **order.get("faults", {}))
            writer.write(_response(204, b"", "application/json"))
        elif path.endswith("/stats"):
            stats = json.dumps({m: dict(c) for m, c in self.stats.items()}).encode()
            writer.write(_response(200, stats, "application/json"))
        elif path.endswith("/models"):
            models = {"object": "list", "data": [{"id": m, "object": "model"} for m in self.stats]}
            writer.write(_response(200, json.dumps(models).encode(), "application/json"))
        else:
            writer.write(_response(404, b"{}", "application/json"))
        return True

    async def _chat(self, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        model = str(body.get("model") or "")
        stats = self.stats.setdefault(model, Counter())
        stats["requests"] += 1
        if self.keep_bodies:
            self.bodies.append(body)
        faults = self.faults(model)
        if faults.requests_per_s is not None:
            wait = self._over_rate(model, faults.requests_per_s)
            if wait is not None:
                stats["rate_limited"] += 1
                headers = rate_limit_headers(wait, faults.requests_per_s)
                writer.write(error_response(429, "Rate limit reached for requests", headers))
                return True
        if faults.hang:
            stats["hung"] += 1
            await self._healed.setdefault(model if model in self._faults else "*", asyncio.Event()).wait()
            faults = self.faults(model)
        if faults.latency_s:
            await asyncio.sleep(faults.latency_s)
        if faults.status is not None:
            stats["errors"] += 1
            retry = faults.retry_after_s
            headers = rate_limit_headers(retry, 0) if retry is not None else None
            writer.write(error_response(faults.status, f"fault server: {faults.status} for {model}", headers))
            return True
        text, calls = self.answer(body)
        if faults.cut_after_chunks is None and not faults.token_delay_s:
            stats["answered"] += 1
            writer.write(self._whole(model, text, calls))
            return True
        return await self._trickle(answer_chunks(text, calls, model), faults, writer, stats)

    def _over_rate(self, model: str, per_second: float) -> float | None:
        """None if the request is within the rate; else how long until the window has room."""
        now = time.monotonic()
        window = self._windows.setdefault(model, deque())
        while window and window[0] <= now - 1.0:
            window.popleft()
        if len(window) >= per_second:
            return window[0] + 1.0 - now
        window.append(now)
        return None

    def _whole(self, model: str, text: str, calls: list[ToolCall]) -> bytes:
        """A streamed answer sent in one write (prepared once per answer)."""
        key = (model, json.dumps([text, calls]))
        prepared = self._prepared.get(key)
        if prepared is None:
            events = b"".join(_event(c) for c in answer_chunks(text, calls, model)) + _event("[DONE]")
            prepared = self._prepared[key] = _response(200, events, "text/event-stream")
        return prepared

    async def _trickle(
        self, chunks: list[dict[str, Any]], faults: Faults, writer: asyncio.StreamWriter, stats: Counter[str]
    ) -> bool:
        """A streamed answer chunk by chunk (chunked encoding), slowly or cut midway."""
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for sent, chunk in enumerate([*chunks, "[DONE]"]):
            if sent == faults.cut_after_chunks:
                stats["cut"] += 1
                await writer.drain()
                writer.transport.abort()
                return False
            event = _event(chunk)
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
            if faults.token_delay_s:
                await asyncio.sleep(faults.token_delay_s)
        writer.write(b"0\r\n\r\n")
        stats["answered"] += 1
        return True


async def serve(port: int, latency: float) -> None:
    server = FaultServer(port=port)
    async with server:
        server.set("*", latency_s=latency)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.latency))


if __name__ == "__main__":
    main()
