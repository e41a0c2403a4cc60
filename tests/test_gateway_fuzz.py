"""Property-based fuzzing of the gateway from its own OpenAPI document (schemathesis): whatever a
client sends, over real HTTP, the gateway answers with a documented status, never a 5xx, and a
body that matches the documented schema.

The two streaming routes are left out: the event stream never ends by design (tests/test_gateway_http.py
exercises it end to end), and the AG-UI route is driven by the official client (tests/test_gateway_agui.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from gateway import Limits
from gateway.openapi import document
from tests.gateway_support import AGENTS, RunningGateway, auth, serve_gateway

STREAMS = ["/v1/sessions/{session_id}/events", "/v1/agui/{agent}"]
schema = schemathesis.openapi.from_dict(document(AGENTS)).exclude(path=STREAMS)
CALLER = {"user": "alice"}


@schema.auth()
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
        yield running


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
