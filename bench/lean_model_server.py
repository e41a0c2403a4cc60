"""An OpenAI-compatible chat-completions server for benchmarks that costs next to no CPU.

The test suite's fake (tests/openai_server.py, Starlette) is faithful but spends about as much
CPU per call as the client; on a 2-core machine running the gateway, the workers and the driver
too, it would be what a production benchmark measures. This one speaks just enough HTTP/1.1
(keep-alive, Content-Length bodies) on raw asyncio streams and answers every request with one
of three streamed answers built once at start: ``lookup``, then ``notify``, then a text answer
(three model calls and two tool steps per turn, by the number of tool results after the last
user message), each after ``latency`` seconds. ``--plain``: the text answer to every call (one
call a turn: a model that makes a turn wait ``latency`` seconds). ``GET /stats``: the calls
waiting for their answer now, and those answered (JSON).

    PYTHONPATH=. .venv/bin/python bench/lean_model_server.py --port 8089 --latency 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

ANSWER = "The order is delayed; the customer was told."


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    events = [f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks]
    return ("".join(events) + "data: [DONE]\n\n").encode()


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-lean",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {**_chunk({}), "choices": [], "usage": usage}


def _tool_call(call_id: str, name: str) -> bytes:
    head = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    arguments = {"index": 0, "function": {"arguments": '{"order_id": "A-1"}'}}
    return _sse(
        [
            _chunk({"role": "assistant", "content": None, "tool_calls": [head]}),
            _chunk({"tool_calls": [arguments]}),
            _chunk({}, "tool_calls"),
            _usage(60, 12),
        ]
    )


def _text() -> bytes:
    pieces = [ANSWER[i : i + 8] for i in range(0, len(ANSWER), 8)]
    chunks = [_chunk({"role": "assistant", "content": ""})] + [_chunk({"content": p}) for p in pieces]
    return _sse([*chunks, _chunk({}, "stop"), _usage(90, 10)])


def _response(body: bytes) -> bytes:
    head = (
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


ANSWERS = [_response(_tool_call("c1", "lookup")), _response(_tool_call("c2", "notify")), _response(_text())]
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


def answer_for(body: bytes) -> bytes:
    """The step's answer: by the tool results after the last user message."""
    messages = json.loads(body)["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    results = sum(1 for m in messages[last_user + 1 :] if m["role"] == "tool")
    return ANSWERS[min(results, len(ANSWERS) - 1)]


class Stats:
    """Calls waiting for their answer now, and answered so far."""

    def __init__(self) -> None:
        self.waiting = 0
        self.answered = 0

    def response(self) -> bytes:
        body = json.dumps({"waiting": self.waiting, "answered": self.answered}).encode()
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        return head.encode() + body


async def _serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latency: float, plain: bool, stats: Stats
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = _content_length(lines[1:])
            body = await reader.readexactly(length) if length else b""
            if path == "/stats":
                writer.write(stats.response())
                continue
            if not path.endswith("/chat/completions"):
                writer.write(NOT_FOUND)
                continue
            reply = ANSWERS[-1] if plain else answer_for(body)
            stats.waiting += 1
            try:
                await asyncio.sleep(latency)
            finally:
                stats.waiting -= 1
            writer.write(reply)
            stats.answered += 1
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _content_length(headers: list[str]) -> int:
    for header in headers:
        name, _, value = header.partition(":")
        if name.lower() == "content-length":
            return int(value)
    return 0


async def serve(port: int, latency: float, plain: bool = False) -> None:
    stats = Stats()
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(r, w, latency, plain, stats), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--plain", action="store_true", help="the text answer to every call")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.latency, args.plain))


if __name__ == "__main__":
    main()
