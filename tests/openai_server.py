"""A faithful fake of the OpenAI Chat Completions HTTP API, served for real over TCP.

Adapters are tested through the real ``openai`` SDK and a real HTTP connection, so what is
exercised is what runs in production: request serialisation, Server-Sent Events parsing, HTTP
error mapping and the connection dropping mid-stream. Patching the SDK would test none of that.

The server plays a script, one step per chat completion request:

* ``FakeReply``: a streamed (or plain JSON) answer with text and/or tool calls, chunked the way
  OpenAI chunks it: a role delta first, text in small pieces, each tool call split into a head
  (id, name, empty arguments) and argument fragments, a finish chunk, an optional usage chunk
  with empty ``choices``, then ``data: [DONE]``.
* ``FakeError``: an HTTP error with an OpenAI-style ``{"error": {...}}`` body.
* ``FakeDrop``: streams some text, then closes the connection without finishing the response.
* ``FakeStreamError``: streams some text, then an ``{"error": {...}}`` event, as servers report
  a failure after the 200 (an overloaded backend, a generation error).

``ClosingFront`` sits in front of the server and closes connections the way a server's keep-alive
timeout does when it runs out as the client reuses the connection.

A request's ``stop`` texts are honoured as the real API does: the answer ends before the first one
(and carries no tool calls then).

``/v1/embeddings`` is not scripted: given ``embed`` (texts to vectors, e.g. the local memory
embedder) it computes real vectors, float or base64 as the client asks, like the real API.

Malformed requests get the 400 the real API would give and do not consume a step.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass(frozen=True)
class FakeReply:
    text: str = ""
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    """(call id, function name, arguments JSON text)."""
    chunk_size: int = 5
    usage: tuple[int, int] | None = None
    """(prompt_tokens, completion_tokens) to report; None = count words."""
    cached_tokens: int = 0
    """prompt_tokens_details.cached_tokens to report (the provider's prompt cache)."""
    delay_s: float = 0.0
    """Wait this long before the first byte (a slow first token)."""
    stall_after_chunks: int | None = None
    """Stop sending for ``stall_s`` after this many chunks (a stall mid-stream)."""
    stall_s: float = 0.0


@dataclass(frozen=True)
class FakeError:
    status: int
    message: str
    retry_after: str | None = None
    """A Retry-After header (429, 503)."""


@dataclass(frozen=True)
class FakeMalformed:
    after_text: str
    """Text streamed before a data line that is not JSON."""


@dataclass(frozen=True)
class FakeDrop:
    after_text: str
    """Text streamed before the connection is cut."""


@dataclass(frozen=True)
class FakeStreamError:
    after_text: str
    message: str
    """The error event's message, sent after ``after_text``."""


Step = FakeReply | FakeError | FakeDrop | FakeMalformed | FakeStreamError

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    429: "requests",
}
_ROLES = {"system", "developer", "user", "assistant", "tool"}


class DroppedConnection(Exception):
    """Raised inside a response body: uvicorn then closes the socket mid-response."""


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code), status_code=status)


def _count_tokens(text: str) -> int:
    return len(text.split())


async def _accepted(request: Request, validate: Callable[[Any], str | None]) -> tuple[Any, Response | None]:
    """The request's JSON body, or the 401 / 400 the real API gives instead (no key, bad body)."""
    if not request.headers.get("authorization", "").startswith("Bearer "):
        return None, _error(401, "You didn't provide an API key.", "missing_api_key")
    try:
        body = await request.json()
    except ValueError:
        body = None
    problem = validate(body)
    return body, (_error(400, problem, "invalid_request") if problem else None)


def _request_tokens(body: dict[str, Any]) -> int:
    """The request's size as the server counts it: tiktoken cl100k over every message, tool
    call and tool definition (a provider's count differs a little from the client's estimate)."""
    from turnlog.engine.models.tokens import shared_counter

    counter = shared_counter("cl100k_base")
    total = 0
    for message in body.get("messages", []):
        total += 4 + counter.count(str(message.get("content") or ""))
        for call in message.get("tool_calls") or []:
            total += counter.count(json.dumps(call))
    return total + counter.count(json.dumps(body.get("tools") or []))


def _prompt_text(body: dict[str, Any]) -> str:
    return " ".join(str(m.get("content") or "") for m in body.get("messages", []))


def validate_request(body: Any) -> str | None:
    """The message the real API gives a malformed chat completion request, or None."""
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request."
    if not body.get("model"):
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "[] is too short - 'messages'"
    if body.get("stream_options") is not None and not body.get("stream"):
        return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and len(stop) <= 4)):
        return "Invalid 'stop': expected a string or an array of at most 4 strings."
    return _validate_messages(messages) or _validate_tools(body.get("tools"))


def _validate_messages(messages: list[Any]) -> str | None:
    pending: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES:
            return f"Invalid value: '{role}'. Supported values are: {sorted(_ROLES)} - 'messages[{i}].role'"
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                    f"message with 'tool_calls' - 'messages[{i}]'"
                )
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                f"{sorted(pending)}"
            )
        if role == "assistant":
            pending = {c.get("id") for c in message.get("tool_calls") or []}
    return None


def _validate_tools(tools: Any) -> str | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not tools:
        return "[] is too short - 'tools'"
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            return f"Missing required parameter: 'tools[{i}].type'."
        if not isinstance(tool.get("function"), dict) or not tool["function"].get("name"):
            return f"Missing required parameter: 'tools[{i}].function.name'."
    return None


class _ChunkWriter:
    """Builds the chat.completion.chunk objects of one streamed answer."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            data["usage"] = None
        return data

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict[str, Any]:
        data = self.chunk({})
        data["choices"] = []
        data["usage"] = _usage(prompt_tokens, completion_tokens, cached)
        return data


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


def _function(name: str, arguments: str) -> dict[str, str]:
    return {"name": name, "arguments": arguments}


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _text_chunks(writer: _ChunkWriter, text: str, size: int) -> Iterator[dict[str, Any]]:
    yield writer.chunk({"role": "assistant", "content": "", "refusal": None})
    for piece in _pieces(text, size):
        yield writer.chunk({"content": piece})


def _tool_call_chunks(writer: _ChunkWriter, reply: FakeReply, first: bool) -> Iterator[dict[str, Any]]:
    for index, (call_id, name, arguments) in enumerate(reply.tool_calls):
        head = {"index": index, "id": call_id, "type": "function", "function": _function(name, "")}
        delta: dict[str, Any] = {"tool_calls": [head]}
        if first and index == 0:
            delta = {"role": "assistant", "content": None, "refusal": None, **delta}
        yield writer.chunk(delta)
        for piece in _pieces(arguments, reply.chunk_size) or [""]:
            yield writer.chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})


def _reply_usage(reply: FakeReply, body: dict[str, Any]) -> tuple[int, int]:
    if reply.usage is not None:
        return reply.usage
    produced = reply.text + " ".join(args for _, _, args in reply.tool_calls)
    return _count_tokens(_prompt_text(body)), _count_tokens(produced)


def reply_chunks(reply: FakeReply, body: dict[str, Any], model: str) -> Iterator[dict[str, Any]]:
    """Every chunk of a streamed answer, in the order OpenAI sends them."""
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    writer = _ChunkWriter(model, include_usage)
    with_text = bool(reply.text) or not reply.tool_calls
    if with_text:
        yield from _text_chunks(writer, reply.text, reply.chunk_size)
    yield from _tool_call_chunks(writer, reply, first=not with_text)
    yield writer.chunk({}, "tool_calls" if reply.tool_calls else "stop")
    if include_usage:
        yield writer.usage_chunk(*_reply_usage(reply, body), reply.cached_tokens)


def completion(reply: FakeReply, body: dict[str, Any], model: str) -> dict[str, Any]:
    """The non-streaming chat.completion object for a reply."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": _function(n, a)} for i, n, a in reply.tool_calls
        ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            }
        ],
        "usage": _usage(*_reply_usage(reply, body), reply.cached_tokens),
    }


def _sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


async def _stream_reply(reply: FakeReply, body: dict[str, Any], model: str) -> AsyncIterator[bytes]:
    if reply.delay_s:
        await asyncio.sleep(reply.delay_s)
    for sent, chunk in enumerate(reply_chunks(reply, body, model)):
        if sent == reply.stall_after_chunks:
            await asyncio.sleep(reply.stall_s)
        yield _sse(chunk)
    yield _sse("[DONE]")


async def _stream_malformed(step: FakeMalformed, model: str) -> AsyncIterator[bytes]:
    writer = _ChunkWriter(model, include_usage=False)
    for chunk in _text_chunks(writer, step.after_text, 5):
        yield _sse(chunk)
    yield b"data: {this is not json\n\n"


async def _stream_then_error(step: FakeStreamError, model: str) -> AsyncIterator[bytes]:
    writer = _ChunkWriter(model, include_usage=False)
    for chunk in _text_chunks(writer, step.after_text, 5):
        yield _sse(chunk)
    yield _sse({"error": {"message": step.message, "type": "server_error", "code": None}})


async def _stream_then_drop(drop: FakeDrop, body: dict[str, Any], model: str) -> AsyncIterator[bytes]:
    writer = _ChunkWriter(model, include_usage=False)
    for chunk in _text_chunks(writer, drop.after_text, 5):
        yield _sse(chunk)
    raise DroppedConnection("FakeDrop: closing the connection mid-stream")


async def _json_then_drop(drop: FakeDrop) -> AsyncIterator[bytes]:
    yield b'{"id":"chatcmpl-dropped","object":"chat.completion","choices":[{"index":0,"message":'
    raise DroppedConnection("FakeDrop: closing the connection mid-body")


Embed = Callable[[Sequence[str]], Any]
"""Texts to a (len(texts), dim) array of vectors."""


def validate_embeddings_request(body: Any) -> str | None:
    """The message the real API gives a malformed embeddings request, or None."""
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request."
    if not body.get("model"):
        return "you must provide a model parameter"
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        return "'input' must be a non-empty string or a non-empty array of non-empty strings"
    if body.get("encoding_format", "float") not in ("float", "base64"):
        return "Invalid value for 'encoding_format': must be 'float' or 'base64'."
    return None


def _embedding_value(vector: Any, encoding: str) -> list[float] | str:
    if encoding == "base64":
        import numpy as np

        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return [float(x) for x in vector]


class FakeOpenAIServer:
    """The app and its state; ``serve_openai`` runs it on a real socket."""

    def __init__(
        self,
        script: Iterable[Step],
        model: str = "fake-model",
        context_window: int | None = None,
        embed: Embed | None = None,
        respond: Callable[[dict[str, Any]], Step] | None = None,
    ) -> None:
        self.script: deque[Step] = deque(script)
        self.respond = respond
        """Answers each request from its body instead of the script (many concurrent sessions, as
        in bench/production.py); requests are then not kept."""
        self.model = model
        self.context_window = context_window
        """Refuse requests longer than this many tokens the way OpenAI does (400,
        context_length_exceeded), without consuming a step; None accepts any length."""
        self.embed = embed
        self.embedding_requests: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        """JSON bodies of the chat completion requests received, in order."""
        self.headers: list[dict[str, str]] = []
        self.refused: list[dict[str, Any]] = []
        """Requests refused as too long (``context_window``)."""
        self.port = 0
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            ]
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _models(self, request: Request) -> Response:
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "turnlog-tests"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _embeddings(self, request: Request) -> Response:
        body, refused = await _accepted(request, validate_embeddings_request)
        if refused is not None:
            return refused
        if self.embed is None:
            return _error(404, f"The model `{body['model']}` does not support embeddings.", "model_not_found")
        self.embedding_requests.append(body)
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        vectors = await asyncio.to_thread(self.embed, texts)
        encoding = body.get("encoding_format", "float")
        data = [
            {"object": "embedding", "index": i, "embedding": _embedding_value(v, encoding)}
            for i, v in enumerate(vectors)
        ]
        tokens = sum(_count_tokens(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": body["model"], "usage": usage})

    async def _chat(self, request: Request) -> Response:
        body, refused = await _accepted(request, validate_request)
        if refused is not None:
            return refused
        if self.context_window is not None:
            size = _request_tokens(body)
            if size > self.context_window:
                self.refused.append(body)
                return _error(
                    400,
                    f"This model's maximum context length is {self.context_window} tokens. However, your "
                    f"messages resulted in {size} tokens. Please reduce the length of the messages.",
                    "context_length_exceeded",
                )
        if self.respond is not None:
            return self._answer(self.respond(body), body)
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if not self.script:
            return _error(
                500,
                f"fake OpenAI server: script exhausted after {len(self.requests) - 1} "
                "requests; add steps to the script",
                "script_exhausted",
            )
        return self._answer(self.script.popleft(), body)

    def _answer(self, step: Step, body: dict[str, Any]) -> Response:
        model = str(body.get("model") or self.model)
        if isinstance(step, FakeReply):
            step = _stopped(step, body.get("stop"))
        streaming = bool(body.get("stream"))
        if isinstance(step, FakeError):
            response = _error(step.status, step.message)
            if step.retry_after is not None:
                response.headers["retry-after"] = step.retry_after
            return response
        if isinstance(step, FakeMalformed):
            return StreamingResponse(_stream_malformed(step, model), media_type="text/event-stream")
        if isinstance(step, FakeStreamError):
            return StreamingResponse(_stream_then_error(step, model), media_type="text/event-stream")
        if isinstance(step, FakeDrop):
            if streaming:
                return StreamingResponse(_stream_then_drop(step, body, model), media_type="text/event-stream")
            return StreamingResponse(_json_then_drop(step), media_type="application/json")
        if streaming:
            return StreamingResponse(
                _stream_reply(step, body, model),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        return JSONResponse(completion(step, body, model))


def _stopped(reply: FakeReply, stop: str | list[str] | None) -> FakeReply:
    """The reply as the model's output ends at the first stop text (excluded)."""
    texts = [stop] if isinstance(stop, str) else list(stop or [])
    cuts = [i for i in (reply.text.find(t) for t in texts if t) if i >= 0]
    if not cuts:
        return reply
    return dataclasses.replace(reply, text=reply.text[: min(cuts)], tool_calls=[])


def free_port() -> int:
    """A port nothing listens on (right now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_accepting(port: int, thread: threading.Thread, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("the fake OpenAI server thread exited during startup")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.02)
    raise RuntimeError(f"the fake OpenAI server did not accept connections on port {port} in {timeout_s} s")


class ClosingFront:
    """A TCP front for a server that closes connections the way a server's keep-alive ends.

    ``reused``: a connection that has carried a response is closed when the next request arrives
    on it, unread, as when the server's keep-alive timeout runs out just as the client reuses the
    connection (the server never sees that request). ``every``: every connection is closed on its
    first request, as a server that crashes on it. Run it with ``async with`` in the test's loop.
    """

    def __init__(self, port: int, close: str = "reused") -> None:
        if close not in ("reused", "every"):
            raise ValueError(f"close must be 'reused' or 'every', not {close!r}")
        self.port, self.close = port, close
        self.connections = 0
        self.closed = 0
        """Requests the front closed the connection on (they never reached the server)."""
        self.base_url = ""
        """Set on entering: where the client should send its requests."""
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ClosingFront:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.base_url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        await asyncio.gather(*self._relays)  # each ends when its client has closed its connection

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        self.connections += 1
        answered = asyncio.Event()
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def relay_responses() -> None:
            while data := await upstream_reader.read(65536):
                answered.set()
                writer.write(data)

        responses = asyncio.create_task(relay_responses())
        try:
            while data := await reader.read(65536):
                if self.close == "every" or answered.is_set():  # no pipelining: this is a new request
                    self.closed += 1
                    writer.transport.abort()  # the request unread, as the server's close leaves it
                    return
                upstream_writer.write(data)
        finally:
            responses.cancel()
            for stream in (upstream_writer, writer):
                stream.close()
                with contextlib.suppress(ConnectionError):
                    await stream.wait_closed()


@contextlib.contextmanager
def serve_openai(
    script: Iterable[Step],
    *,
    model: str = "fake-model",
    log_level: str = "warning",
    context_window: int | None = None,
    embed: Embed | None = None,
) -> Iterator[FakeOpenAIServer]:
    """Serve a FakeOpenAIServer on 127.0.0.1:<free port> in a background thread."""
    fake = FakeOpenAIServer(script, model, context_window, embed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    fake.port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        fake.app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="fake-openai", daemon=True)
    thread.start()
    try:
        _wait_until_accepting(fake.port, thread)
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
