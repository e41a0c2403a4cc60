"""OpenAICompatibleModel against a real HTTP server through the real openai SDK (no patching)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.openai_server import (
    ClosingFront,
    FakeDrop,
    FakeError,
    FakeReply,
    FakeStreamError,
    Step,
    free_port,
    serve_openai,
)
from turnlog.engine.errors import ModelError
from turnlog.engine.events import ToolCallSpec
from turnlog.engine.messages import ChatMessage
from turnlog.engine.models.base import ModelChunk, ModelRequest, ModelResponse, TextDelta, Usage
from turnlog.engine.models.openai_compat import OpenAICompatibleModel

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME_TOOL = {"name": "get_time", "description": "Local time.", "parameters": {"type": "object"}}


def ask(text: str, *tools: dict[str, Any]) -> ModelRequest:
    return ModelRequest(messages=[ChatMessage.system("Be brief."), ChatMessage.user(text)], tools=tools)


async def collect(model: OpenAICompatibleModel, request: ModelRequest) -> list[ModelChunk]:
    return [chunk async for chunk in model.stream(request)]


async def collect_until_error(
    model: OpenAICompatibleModel, request: ModelRequest
) -> tuple[list[ModelChunk], ModelError]:
    chunks: list[ModelChunk] = []
    with pytest.raises(ModelError) as caught:
        async for chunk in model.stream(request):
            chunks.append(chunk)
    return chunks, caught.value


def split(chunks: list[ModelChunk]) -> tuple[list[TextDelta], ModelResponse]:
    *deltas, last = chunks
    assert all(isinstance(d, TextDelta) for d in deltas), chunks
    assert isinstance(last, ModelResponse), chunks
    return deltas, last  # type: ignore[return-value]


@pytest.mark.asyncio
async def test_streamed_text_arrives_as_deltas_then_one_response_with_server_usage() -> None:
    answer = "The capital of France is Paris."
    with serve_openai([FakeReply(answer, chunk_size=4, usage=(17, 8))], model="fake-gpt") as server:
        model = OpenAICompatibleModel("fake-gpt", base_url=server.base_url)
        try:
            deltas, response = split(await collect(model, ask("Capital of France?")))
        finally:
            await model.aclose()
    assert len(deltas) == len(answer) // 4 + 1
    assert "".join(d.text for d in deltas) == answer
    assert response.text == answer
    assert response.tool_calls == ()
    assert response.usage == Usage(input_tokens=17, output_tokens=8)
    assert response.finish_reason == "stop"
    assert response.model == "fake-gpt"


@pytest.mark.asyncio
async def test_tool_call_split_across_chunks_is_reassembled_and_never_streamed_as_text() -> None:
    arguments = json.dumps({"city": "Zürich", "units": "metric", "note": 'a "quoted" word'})
    script = [FakeReply(tool_calls=[("call_abc123", "get_weather", arguments)], chunk_size=3)]
    with serve_openai(script) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        try:
            chunks = await collect(model, ask("Weather in Zürich?", WEATHER_TOOL))
        finally:
            await model.aclose()
    deltas, response = split(chunks)
    assert deltas == []
    assert response.tool_calls == (ToolCallSpec("call_abc123", "get_weather", arguments),)
    assert response.text == ""
    assert response.finish_reason == "tool_calls"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


@pytest.mark.asyncio
async def test_text_and_two_parallel_tool_calls_in_one_response() -> None:
    calls = [("call_1", "get_weather", '{"city": "Oslo"}'), ("call_2", "get_time", "{}")]
    with serve_openai([FakeReply("Checking both.", tool_calls=calls, chunk_size=2)]) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        try:
            request = ask("Weather and time in Oslo?", WEATHER_TOOL, TIME_TOOL)
            deltas, response = split(await collect(model, request))
        finally:
            await model.aclose()
    assert "".join(d.text for d in deltas) == "Checking both."
    assert not any("{" in d.text or "call_" in d.text for d in deltas)
    assert response.tool_calls == tuple(ToolCallSpec(*c) for c in calls)


@pytest.mark.asyncio
async def test_request_carries_converted_history_tools_and_include_usage() -> None:
    call = ToolCallSpec("call_w1", "get_weather", '{"city": "Oslo"}')
    history = [
        ChatMessage.system("You are a weather bot."),
        ChatMessage.user("Weather in Oslo?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", '{"temp_c": 4}', tool_call_id="call_w1", name="get_weather"),
        ChatMessage("assistant", "It is 4 °C."),
        ChatMessage.user("Thanks!"),
    ]
    with serve_openai([FakeReply("You're welcome.")]) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        try:
            await collect(model, ModelRequest(messages=history, tools=[WEATHER_TOOL]))
        finally:
            await model.aclose()
    [body] = server.requests
    assert body["model"] == "fake-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_w1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_w1", "content": '{"temp_c": 4}'},
        {"role": "assistant", "content": "It is 4 °C."},
        {"role": "user", "content": "Thanks!"},
    ]
    assert body["tools"] == [{"type": "function", "function": WEATHER_TOOL}]


@pytest.mark.asyncio
async def test_no_tools_key_when_no_tools_are_offered() -> None:
    with serve_openai([FakeReply("ok")]) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        try:
            await collect(model, ask("hi"))
        finally:
            await model.aclose()
    assert "tools" not in server.requests[0]


@pytest.mark.asyncio
async def test_server_error_becomes_model_error_naming_status_and_model() -> None:
    with serve_openai([FakeError(500, "The server had an error while processing your request.")]) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        try:
            chunks, error = await collect_until_error(model, ask("hi"))
        finally:
            await model.aclose()
    assert chunks == []
    message = str(error)
    assert "500" in message and "'fake-model'" in message and server.base_url in message
    assert "The server had an error while processing your request." in message


@pytest.mark.asyncio
async def test_unknown_model_404_says_what_to_check() -> None:
    with serve_openai([FakeError(404, "The model `nope` does not exist.")]) as server:
        model = OpenAICompatibleModel("nope", base_url=server.base_url)
        try:
            _, error = await collect_until_error(model, ask("hi"))
        finally:
            await model.aclose()
    assert "404" in str(error) and "does not exist" in str(error) and "model name" in str(error)


async def broken_then_working(broken: Step) -> tuple[list[ModelChunk], ModelError, list[ModelChunk], str]:
    """A call the server breaks with ``broken``, then one it answers on the same model: what
    the first streamed, its error, what the second streamed, the server's URL."""
    with serve_openai([broken, FakeReply("next call works")], log_level="critical") as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        try:
            chunks, error = await collect_until_error(model, ask("hi"))
            retried = await collect(model, ask("hi"))
        finally:
            await model.aclose()
    return chunks, error, retried, server.base_url


@pytest.mark.asyncio
async def test_dropped_stream_raises_model_error_and_yields_no_response() -> None:
    chunks, error, retried, base_url = await broken_then_working(FakeDrop("The answer is forty"))
    assert not any(isinstance(c, ModelResponse) for c in chunks)
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "The answer is forty"
    assert base_url in str(error) and "discarded" in str(error)
    assert "broke before the answer was complete" in str(error)
    assert split(retried)[1].text == "next call works"


@pytest.mark.asyncio
async def test_an_error_event_mid_stream_is_a_model_error_with_its_message() -> None:
    broken = FakeStreamError("Half an ans", "the backend ran out of memory")
    chunks, error, retried, base_url = await broken_then_working(broken)
    assert not any(isinstance(c, ModelResponse) for c in chunks)
    assert "the backend ran out of memory" in str(error) and base_url in str(error)
    assert "discarded" in str(error)
    assert split(retried)[1].text == "next call works"


async def test_a_server_slower_than_the_request_timeout_is_a_timeout_naming_the_limit() -> None:
    with serve_openai([FakeReply("too late", delay_s=3.0)], log_level="critical") as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url, request_timeout_s=0.5)
        try:
            chunks, error = await collect_until_error(model, ask("hi"))
        finally:
            await model.aclose()
    assert chunks == []
    assert "did not answer within 0.5 s" in str(error) and server.base_url in str(error)


async def test_a_kept_alive_connection_the_server_closed_as_it_was_reused_is_sent_again() -> None:
    """The local-model test once failed here: llama.cpp's keep-alive (5 s, as the client's) ran
    out as the next call reused the connection ('Cannot write to closing transport')."""
    with serve_openai([FakeReply("first answer"), FakeReply("second answer")]) as server:
        async with ClosingFront(server.port, close="reused") as front:
            model = OpenAICompatibleModel("fake-model", base_url=front.base_url, request_timeout_s=5)
            try:
                first = await collect(model, ask("one"))
                second = await collect(model, ask("two"))
            finally:
                await model.aclose()
    assert split(first)[1].text == "first answer"
    assert split(second)[1].text == "second answer"
    assert front.closed == 1 and front.connections == 2  # the second call went out on a new connection
    assert [r["messages"][-1]["content"] for r in server.requests] == ["one", "two"]


async def test_a_server_that_closes_every_connection_is_asked_twice_then_named() -> None:
    with serve_openai([FakeReply("never sent")]) as server:
        async with ClosingFront(server.port, close="every") as front:
            model = OpenAICompatibleModel("fake-model", base_url=front.base_url, request_timeout_s=30)
            try:
                chunks, error = await collect_until_error(model, ask("hi"))
            finally:
                await model.aclose()
    assert chunks == [] and server.requests == []
    assert front.closed == 2  # sent once more, not retried without end
    assert "closed the connection before answering" in str(error) and front.base_url in str(error)
    assert "did not answer within" not in str(error)  # the transport calls it a timeout; it is not


async def test_unreachable_endpoint_raises_model_error_naming_the_url() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    model = OpenAICompatibleModel("fake-model", base_url=base_url, request_timeout_s=5)
    try:
        chunks, error = await collect_until_error(model, ask("hi"))
    finally:
        await model.aclose()
    assert chunks == []
    assert base_url in str(error) and "cannot reach" in str(error) and "TURNLOG_BASE_URL" in str(error)


@pytest.mark.asyncio
async def test_empty_answer_is_a_model_error() -> None:
    with serve_openai([FakeReply("")]) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        try:
            chunks, error = await collect_until_error(model, ask("hi"))
        finally:
            await model.aclose()
    assert chunks == []
    assert "empty response" in str(error)


@pytest.mark.asyncio
async def test_exhausted_script_answers_500() -> None:
    with serve_openai([]) as server:
        model = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        try:
            _, error = await collect_until_error(model, ask("hi"))
        finally:
            await model.aclose()
    assert "500" in str(error) and "script exhausted" in str(error)


@pytest.mark.asyncio
async def test_a_client_passed_in_is_used_and_left_open() -> None:
    with serve_openai([FakeReply("one"), FakeReply("two")]) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        model = OpenAICompatibleModel("fake-model", client=client)
        assert split(await collect(model, ask("hi")))[1].text == "one"
        await model.aclose()
        assert not client.is_closed()
        assert split(await collect(model, ask("hi")))[1].text == "two"
        await client.close()
    assert server.headers[0]["authorization"] == "Bearer sk-test"


@pytest.mark.asyncio
async def test_fake_server_also_speaks_plain_json_and_lists_models() -> None:
    calls = [("call_9", "get_time", "{}")]
    with serve_openai([FakeReply("plain"), FakeReply(tool_calls=calls)], model="fake-gpt") as server:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0) as client:
            models = await client.models.list()
            user = [{"role": "user", "content": "x"}]
            plain = await client.chat.completions.create(model="fake-gpt", messages=user)  # type: ignore[arg-type]
            tools = await client.chat.completions.create(model="fake-gpt", messages=user)  # type: ignore[arg-type]
            with pytest.raises(openai.BadRequestError, match="tool_calls"):
                await client.chat.completions.create(
                    model="fake-gpt", messages=[{"role": "tool", "tool_call_id": "nope", "content": "x"}]
                )
    assert [m.id for m in models.data] == ["fake-gpt"]
    assert plain.choices[0].message.content == "plain" and plain.usage is not None
    assert tools.choices[0].finish_reason == "tool_calls"
    assert tools.choices[0].message.tool_calls[0].function.arguments == "{}"  # type: ignore[index,union-attr]


async def test_temperature_and_answer_cap_are_sent_when_set() -> None:
    with serve_openai([FakeReply("ok"), FakeReply("ok")]) as server:
        capped = OpenAICompatibleModel("fake-model", base_url=server.base_url, temperature=0.0, max_tokens=64)
        plain = OpenAICompatibleModel("fake-model", base_url=server.base_url)
        await collect(capped, ask("hi"))
        await collect(plain, ask("hi"))
        await capped.aclose()
        await plain.aclose()
    assert (server.requests[0]["temperature"], server.requests[0]["max_tokens"]) == (0.0, 64)
    assert "temperature" not in server.requests[1] and "max_tokens" not in server.requests[1]
