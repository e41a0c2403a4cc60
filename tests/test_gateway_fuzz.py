"""Property-based fuzzing of the gateway from its own OpenAPI document (schemathesis): whatever a
client sends, over real HTTP, the gateway answers with a documented status, never a 5xx, and a
body that matches the documented schema. Half the session ids are a real session's, so the
session routes are fuzzed past their 404; each case carries the key of the user it runs as
(alice, and root for the admin routes).

The two streaming routes are left out: the event stream never ends by design (tests/test_gateway_http.py
exercises it end to end), and the AG-UI route is driven by the official client (tests/test_gateway_agui.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from gateway import Limits
from gateway.openapi import document
from tests.gateway_support import AGENTS, RunningGateway, auth, serve_gateway

STREAMS = ["/v1/sessions/{session_id}/events", "/v1/agui/{agent}"]
schema = schemathesis.openapi.from_dict(document(AGENTS)).exclude(path=STREAMS)
CALLER = {"user": "alice"}
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
    with serve_gateway(home, Limits(requests_per_second=1e6, burst=10**6)) as running:
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
    case.validate_response(response)
