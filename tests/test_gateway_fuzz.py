"""Property-based fuzzing of the gateway from its own OpenAPI document (schemathesis): whatever a
client sends, over real HTTP, the gateway answers with a documented status, never a 5xx, and a
body that matches the documented schema. Half the session ids are a real session's, so the
session routes are fuzzed past their 404; each case carries the key of the user it runs as
(alice, and root for the admin routes).

The two streaming routes are left out of the schema-driven cases: the event stream never ends by
design (tests/test_gateway_http.py exercises it end to end), and the AG-UI route is driven by the
official client (tests/test_gateway_agui.py).

Then the hostile classes a schema does not generate, on every route that reads a body (AG-UI
too): JSON nested thousands deep, numbers of thousands of digits, NaN, lone surrogates in values
and keys, NUL in text fields, bytes that are not UTF-8, Unicode digits where a number goes; and
over raw sockets, requests that stop half-way through their headers or their body, a body that
trickles in, idle connections and a chunked body far over the limit. Every one gets a 4xx in the
``{"error", "detail"}`` shape (or, for a connection that sent nothing, a close), nothing reaches
the log, no connection outlives its read timeout, and the server answers normally afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway_support import AGENTS, KEYS, RunningGateway, auth, open_log, serve_gateway
from turnlog.engine import events as ev
from turnlog.gateway import Limits
from turnlog.gateway.openapi import document

STREAMS = ["/v1/sessions/{session_id}/events", "/v1/agui/{agent}"]
schema = schemathesis.openapi.from_dict(document(AGENTS)).exclude(path=STREAMS)
CALLER = {"user": "alice"}
READ_TIMEOUT_S = 1.5
"""The gateway's header and body read timeouts here: short, so the slow-client cases are quick."""
REAL: dict[str, str] = {}
"""A session of alice's with one answered turn, made by the fixture."""


@schema.hook
def map_path_parameters(ctx: schemathesis.HookContext, path_parameters: dict[str, Any] | None) -> Any:
    """Half the session ids are a real session's, so the routes get past the 404 into their own
    checks (bodies, decisions, snapshot versions) with whatever schemathesis sends."""
    if (
        path_parameters
        and "session_id" in path_parameters
        and REAL
        and len(str(path_parameters["session_id"])) % 2
    ):
        path_parameters["session_id"] = REAL["session_id"]
    return path_parameters


@schema.auth(refresh_interval=None)  # no caching: each case carries the key of the user it runs as
class ApiKey:
    """The caller's key, so schemathesis knows the Authorization header is the real credential."""

    def get(self, case: schemathesis.Case, ctx: schemathesis.AuthContext) -> str:
        return auth(CALLER["user"])["Authorization"]

    def set(self, case: schemathesis.Case, data: str, ctx: schemathesis.AuthContext) -> None:
        case.headers = {**(case.headers or {}), "Authorization": data}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    home: Path = tmp_path_factory.mktemp("fuzz")
    limits = Limits(
        requests_per_second=1e6,
        burst=10**6,
        header_timeout_s=READ_TIMEOUT_S,
        body_timeout_s=READ_TIMEOUT_S,
    )
    with serve_gateway(home, limits) as running:
        REAL["session_id"] = asyncio.run(answered_session(running))
        yield running
    REAL.clear()


async def answered_session(running: RunningGateway) -> str:
    async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"agent": "support"}, headers=auth("alice"))
        sid: str = created.json()["session_id"]
        await client.post(f"/v1/sessions/{sid}/messages", json={"text": "A-17?"}, headers=auth("alice"))
        for _ in range(600):
            if (await client.get(f"/v1/sessions/{sid}", headers=auth("alice"))).json()["turns"] == 1:
                return sid
            await asyncio.sleep(0.05)
    raise AssertionError("the turn did not finish")


@schema.parametrize()
@settings(
    max_examples=12, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
@pytest.mark.parametrize("user", ["alice", "root"])
def test_any_request_gets_a_documented_answer(
    case: schemathesis.Case, user: str, fuzzed: RunningGateway
) -> None:
    CALLER["user"] = user
    response = case.call(base_url=fuzzed.url, timeout=30)
    assert response.status_code < 500, response.text
    case.validate_response(response, excluded_checks=data_dependent(response))


def data_dependent(response: Any) -> list[Any]:
    """The checks a refusal that depends on the log's data, not on the schema, is exempt from: a
    ``from_turn`` past the turns the selected sessions have ended is a 422 no schema can foresee."""
    if response.status_code == 422 and response.json()["detail"].startswith("from_turn must be in 0.."):
        return [schemathesis.checks.positive_data_acceptance]
    return []


# -- hostile bodies --------------------------------------------------------------------------------

AGUI_RUN = {
    "threadId": "t-1",
    "runId": "r-1",
    "messages": [{"id": "m-1", "role": "user", "content": "hi"}],
    "tools": [],
    "context": [],
    "state": {},
    "forwardedProps": {},
}
BODY_ROUTES: list[tuple[str, str, dict[str, Any], str]] = [
    # (caller, path, a valid body, its field stored as text: "" when it has none)
    ("alice", "/v1/sessions", {"agent": "support"}, "agent"),
    ("alice", "/v1/sessions/{sid}/messages", {"text": "Where is A-17?"}, "text"),
    ("alice", "/v1/sessions/{sid}/interrupt", {"text": "Stop, A-18 instead"}, "text"),
    ("alice", "/v1/sessions/{sid}/cancel", {"reason": "changed my mind"}, "reason"),
    ("alice", "/v1/sessions/{sid}/approvals/call_1", {"decision": "reject", "note": "no"}, "note"),
    ("alice", "/v1/sessions/{sid}/budget", {"decision": "stop", "note": "enough"}, "note"),
    ("root", "/v1/admin/sessions/{sid}/finish", {"reason": "done"}, "reason"),
    ("root", "/v1/admin/sessions/{sid}/fork", {"version": 1, "agent": "support"}, "agent"),
    ("alice", "/v1/agui/support", AGUI_RUN, ""),
]
UNICODE_DIGITS = "٠١٢٣٤٥٦٧٨٩۰۱۲۳۴۵۶۷۸۹०१२३४५६७८९০১২৩০１２３４５６７８９𝟎𝟏𝟐𝟗²³¹"


KINDS = ["deep", "deep_object", "number", "float", "constant", "surrogate", "surrogate_key", "utf8", "nul"]


@st.composite
def hostile_body(draw: st.DrawFn, kind: str, base: dict[str, Any], text_field: str) -> tuple[bytes, int, str]:
    """A body that is the valid ``base`` but for one hostile part of ``kind``; with the answer it
    must get."""
    valid = json.dumps(base)

    def extra(raw_json: str) -> bytes:  # the valid body plus one more member
        return (valid[:-1] + ', "x": ' + raw_json + "}").encode()

    if kind == "deep":
        n = draw(st.integers(33, 30_000))
        return extra("[" * n + "]" * n), 400, "bad_json"
    if kind == "deep_object":
        n = draw(st.integers(33, 5_000))
        return extra('{"a": ' * n + "0" + "}" * n), 400, "bad_json"
    if kind == "number":
        digits = draw(st.integers(41, 60_000))
        return extra(draw(st.sampled_from(["", "-"])) + "9" * digits), 400, "bad_json"
    if kind == "float":
        literal = draw(st.sampled_from(["1e999", "-1e400", "2.5E+308", "0." + "1" * 5000, "1" * 400 + ".5"]))
        return extra(literal), 400, "bad_json"
    if kind == "constant":
        return extra(draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))), 400, "bad_json"
    if kind in ("surrogate", "surrogate_key"):
        escape = f"\\u{draw(st.integers(0xD800, 0xDFFF)):04x}"
        if kind == "surrogate_key":
            return extra("{" + f'"k{escape}": 1' + "}"), 400, "invalid_text"
        field = text_field or "threadId"
        body = json.dumps({**base, field: "x"}).replace('"x"', f'"a{escape}b"', 1)
        return body.encode(), 400, "invalid_text"
    if kind == "utf8":
        return valid[:-1].encode() + b', "x": "\xff\xfe"}', 400, "bad_json"
    # nul: harmless inside JSON the gateway re-encodes, refused in a field stored as text
    return json.dumps({**base, text_field: "a\x00b"}).encode(), 422, "invalid_input"


@pytest.fixture(scope="module")
def hostile_session(fuzzed: RunningGateway) -> str:
    """alice's session the hostile requests aim at; they must leave it as it is."""
    response = httpx.post(f"{fuzzed.url}/v1/sessions", json={"agent": "support"}, headers=auth("alice"))
    return str(response.json()["session_id"])


def assert_refusal(response: httpx.Response, status: int, code: str, where: str = "") -> None:
    assert (response.status_code, response.headers["content-type"]) == (status, "application/json"), (
        where,
        response.text[:300],
    )
    body = response.json()
    assert set(body) == {"error", "detail"} and body["error"] == code, body
    assert isinstance(body["detail"], str) and body["detail"], body


@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=10, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
@given(data=st.data())
def test_hostile_bodies_get_a_4xx_on_every_route_and_reach_nothing(
    kind: str, data: st.DataObject, fuzzed: RunningGateway, hostile_session: str
) -> None:
    with httpx.Client(timeout=30) as client:
        for user, path, base, text_field in BODY_ROUTES:
            if kind == "nul" and not text_field:
                continue  # AG-UI ids are hashed or echoed as JSON: a NUL there is harmless
            body, status, code = data.draw(hostile_body(kind, base, text_field))
            url = fuzzed.url + path.format(sid=hostile_session)
            response = client.post(
                url, content=body, headers={**auth(user), "Content-Type": "application/json"}
            )
            assert_refusal(response, status, code, path)
            if kind == "nul":
                assert "holds a NUL character" in response.json()["detail"], response.text


@settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
@given(number=st.text(UNICODE_DIGITS, min_size=1, max_size=6) | st.integers(19, 5000).map(lambda n: "9" * n))
def test_odd_digits_where_a_number_goes_get_a_4xx(
    number: str, fuzzed: RunningGateway, hostile_session: str
) -> None:
    sid = hostile_session
    with httpx.Client(base_url=fuzzed.url, timeout=30) as client:
        step = client.get(f"/v1/sessions/{sid}/model_calls/t1/{number}", headers=auth("alice"))
        assert_refusal(step, 422, "invalid_input")
        assert_refusal(
            client.get("/v1/sessions", params={"limit": number}, headers=auth("alice")), 422, "invalid_input"
        )
        replay = client.get(
            f"/v1/admin/sessions/{sid}/replay", params={"after_version": number}, headers=auth("root")
        )
        assert_refusal(replay, 422, "invalid_input")
        resume = client.get(f"/v1/sessions/{sid}/events", params={"after": number}, headers=auth("alice"))
        assert_refusal(resume, 400, "bad_last_event_id")
        header = client.get(
            f"/v1/sessions/{sid}/events", headers={**auth("alice"), "Last-Event-ID": number.encode()}
        )
        assert_refusal(header, 400, "bad_last_event_id")


# -- slow and half-sent requests over raw sockets ------------------------------------------------


async def exchange(port: int, sent: bytes, trickle: bytes = b"") -> tuple[bytes, int]:
    """Send ``sent``, then ``trickle`` a byte at a time (a slow client), and read until the server
    closes the connection; returns what it answered and how many trickled bytes went out."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    trickled = 0

    async def drip() -> None:
        nonlocal trickled
        for i in range(len(trickle)):
            writer.write(trickle[i : i + 1])
            await writer.drain()
            trickled += 1
            await asyncio.sleep(READ_TIMEOUT_S / 8)  # the slow client itself, not a wait for it

    writer.write(sent)
    await writer.drain()
    dripping = asyncio.create_task(drip())
    try:
        answer = await asyncio.wait_for(read_until_closed(reader), 30)
    except TimeoutError:
        raise AssertionError(f"the server kept a slow connection open for 30 s: sent {sent[:80]!r}") from None
    finally:
        dripping.cancel()
        writer.close()
    return answer, trickled


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed the connection. A close with our bytes still unread
    (a body cut off mid-upload) is a reset: what arrived before it is kept (StreamReader.read()
    would drop it with the exception)."""
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            answer += chunk
    return answer


def status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


async def test_slow_and_half_sent_requests_are_cut_off_and_the_server_stays_healthy(
    fuzzed: RunningGateway, hostile_session: str
) -> None:
    port = int(fuzzed.url.rsplit(":", 1)[1])
    key = f"Authorization: Bearer {KEYS['alice']}\r\n".encode()
    post = f"POST /v1/sessions/{hostile_session}/messages HTTP/1.1\r\nHost: t\r\n".encode() + key
    half_head = b"GET /v1/sessions HTTP/1.1\r\nHost: t\r\nAuthoriz"
    half_body = post + b'Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{"text": "wh'
    slow_body = post + b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    chunk = b"%x\r\n%s\r\n" % (32 * 1024, b"a" * 32 * 1024)
    chunked = post + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 4  # 128 KiB, never finished
    connections = fuzzed.server.server_state.connections
    before = len(connections)
    cases = (
        [exchange(port, half_head) for _ in range(40)]
        + [exchange(port, half_body) for _ in range(40)]
        + [exchange(port, b"") for _ in range(10)]
        + [exchange(port, slow_body, trickle=b'{"text": "' + b"x" * 180 + b'"}'), exchange(port, chunked)]
    )
    answers = await asyncio.gather(*cases)

    for answer, _ in answers[:80]:  # the head, or the body, did not arrive in time
        status, body = status_and_body(answer)
        assert status == 408 and body["error"] == "request_timeout", answer
    assert "headers did not arrive" in status_and_body(answers[0][0])[1]["detail"]
    assert "body did not arrive" in status_and_body(answers[40][0])[1]["detail"]
    assert all(answer == b"" for answer, _ in answers[80:90])  # nothing sent: closed, no answer
    (slow, trickled), (too_large, _) = answers[90:]
    assert status_and_body(slow)[0] == 408 and trickled < 190  # cut off while still trickling
    status, body = status_and_body(too_large)  # refused as the chunks announce or bring past the limit
    assert (status, body["error"]) == (413, "body_too_large")
    assert body["detail"].startswith("the request body is ") and body["detail"].endswith("the limit is 65536")
    for _ in range(600):  # none of them is still held, once the server has seen the clients close
        if len(connections) <= before:
            break
        await asyncio.sleep(0.05)
    assert len(connections) <= before

    async with httpx.AsyncClient(base_url=fuzzed.url, timeout=30) as client:
        assert (await client.get("/v1/sessions", headers=auth("alice"))).status_code == 200
    log = open_log(fuzzed.log_path)
    try:
        assert await log.session_version(hostile_session) == 1  # nothing reached the log
    finally:
        await log.close()


async def test_a_refusal_keeps_the_connection_and_a_malformed_request_gets_json(
    fuzzed: RunningGateway,
) -> None:
    port = int(fuzzed.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        bad = b'{"text": "\\ud800"}'
        key = f"Authorization: Bearer {KEYS['alice']}\r\n".encode()
        for request in (
            b"POST /v1/sessions HTTP/1.1\r\nHost: t\r\n"
            + key
            + b"Content-Length: %d\r\n\r\n" % len(bad)
            + bad,
            b"GET /v1/sessions HTTP/1.1\r\nHost: t\r\n" + key + b"\r\n",
        ):
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            length = int(
                next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
            )
            body = json.loads(await asyncio.wait_for(reader.readexactly(length), 30))
            if request.startswith(b"POST"):
                assert head.startswith(b"HTTP/1.1 400") and body["error"] == "invalid_text"
            else:  # the same connection answers the next request
                assert head.startswith(b"HTTP/1.1 200") and "sessions" in body
    finally:
        writer.close()
    for raw, status, code in (
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_request"),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", 431, "headers_too_large"),
        (
            b"POST /v1/sessions HTTP/1.1\r\nHost: t\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
            400,
            "bad_request",
        ),
        (b"POST /v1/sessions HTTP/1.1\r\nHost: t\r\nContent-Length: \xd9\xa3\r\n\r\n", 400, "bad_request"),
    ):
        answer, _ = await exchange(port, raw)
        assert status_and_body(answer)[0] == status and status_and_body(answer)[1]["error"] == code, answer


async def test_a_body_announced_past_the_limit_is_refused_at_once(tmp_path: Path) -> None:
    """A chunk-size line (or a Content-Length) past the body limit gets 413 before any of that
    body is sent: the body timeout here is longer than the client waits, so an answer held
    until it would fail the test."""
    limits = Limits(requests_per_second=1e6, burst=10**6, body_timeout_s=3600)
    with serve_gateway(tmp_path, limits) as running:
        port = int(running.url.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            sid = (
                await client.post("/v1/sessions", json={"agent": "support"}, headers=auth("alice"))
            ).json()["session_id"]
        key = f"Authorization: Bearer {KEYS['alice']}\r\n".encode()
        post = f"POST /v1/sessions/{sid}/messages HTTP/1.1\r\nHost: t\r\n".encode() + key
        chunked = post + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        small = b'{"text": "hello", "pad": "' + b"x" * 1000
        cases = {
            "2**68 announced": chunked + b"%x\r\n" % 2**68,
            "2**68 announced, a few bytes sent": chunked + b'%x\r\n{"text": ' % 2**68,
            "a second chunk passes the limit": chunked
            + b"%x\r\n%s\r\n%x\r\n" % (len(small), small, 65 * 1024),
            "one byte past the limit": chunked + b"%x\r\n" % (64 * 1024 + 1),
            "Content-Length 2**64 - 1": post + b"Content-Length: %d\r\n\r\n" % (2**64 - 1),
            "Content-Length one past": post + b"Content-Length: %d\r\n\r\n{" % (64 * 1024 + 1),
        }
        answers = await asyncio.gather(*(exchange(port, sent) for sent in cases.values()))
        for what, (answer, _) in zip(cases, answers, strict=True):
            status, body = status_and_body(answer)
            assert (status, body["error"]) == (413, "body_too_large"), (what, answer)
            assert "the limit is 65536" in body["detail"], (what, body)

        async def upload() -> AsyncIterator[bytes]:  # a client that sends its whole chunked body
            yield b'{"text": "'
            for _ in range(8):
                yield b"x" * 32 * 1024
            yield b'"}'

        async with httpx.AsyncClient(base_url=running.url, timeout=30) as client:
            url = f"/v1/sessions/{sid}/messages"
            refused = await client.post(url, content=upload(), headers=auth("alice"))
            assert (refused.status_code, refused.json()["error"]) == (413, "body_too_large")
            assert (await client.post(url, json={"text": "A-17?"}, headers=auth("alice"))).status_code == 202
        log = open_log(running.log_path)
        try:
            events = await log.read_session(sid)  # the one message that fit, nothing refused
            assert [e.text for e in events if isinstance(e, ev.UserMessageReceived)] == ["A-17?"]
        finally:
            await log.close()
