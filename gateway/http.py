"""HTTP plumbing shared by the routes: error answers, authentication, limits, JSON bodies."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.errors import (
    ApprovalError,
    ConcurrencyError,
    InputError,
    InvalidArgumentsError,
    LogUnavailableError,
    MessageTooLargeError,
    NoTurnRunningError,
    SessionClosedError,
    SessionNotFoundError,
    SnapshotFormatError,
    SnapshotNotFoundError,
    TurnlogError,
)

from .auth import KeyStore, Principal
from .limits import Limits, RateLimiter

Handler = Callable[[Request], Awaitable[Response]]


class HttpError(Exception):
    """An answer other than success; becomes ``{"error": code, "detail": detail}``."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}


def error_response(exc: HttpError) -> JSONResponse:
    return JSONResponse({"error": exc.code, "detail": exc.detail}, exc.status, headers=exc.headers)


def not_found(session_id: str) -> HttpError:
    """The one answer for a missing session and for another user's: nothing tells them apart."""
    return HttpError(404, "not_found", f"no session {session_id}")


ENGINE_ERRORS: tuple[tuple[type[TurnlogError], int, str], ...] = (
    (MessageTooLargeError, 413, "message_too_large"),
    (InvalidArgumentsError, 422, "invalid_arguments"),
    (InputError, 422, "invalid_input"),
    (SessionClosedError, 409, "session_closed"),
    (NoTurnRunningError, 409, "no_turn_running"),
    (ApprovalError, 409, "not_awaiting_approval"),
    (SnapshotNotFoundError, 404, "snapshot_not_found"),
    (SnapshotFormatError, 409, "snapshot_unreadable"),
    (LogUnavailableError, 503, "log_unavailable"),
)
"""The one table of engine errors → HTTP answers, most specific first."""


def from_engine(exc: TurnlogError, session_id: str = "") -> HttpError:
    if isinstance(exc, SessionNotFoundError):
        return not_found(session_id)
    if isinstance(exc, ConcurrencyError):
        return HttpError(409, "conflict", f"{exc}; try again")
    for kind, status, code in ENGINE_ERRORS:
        if isinstance(exc, kind):
            headers = {"Retry-After": "1"} if status == 503 else None
            return HttpError(status, code, str(exc), headers)
    return HttpError(500, "internal", f"{type(exc).__name__}: {exc}")


class Guard:
    """Authenticates a request, checks its role and rate, and turns errors into answers."""

    def __init__(self, keys: KeyStore, limits: Limits) -> None:
        self.keys = keys
        self.limits = limits
        self.rate = RateLimiter(limits.requests_per_second, limits.burst)

    def authenticate(self, request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise HttpError(
                401,
                "unauthenticated",
                "send your API key as 'Authorization: Bearer KEY'",
                {"WWW-Authenticate": "Bearer"},
            )
        principal = self.keys.authenticate(key.strip())
        if principal is None:
            raise HttpError(401, "unauthenticated", "unknown API key", {"WWW-Authenticate": "Bearer"})
        return principal

    def wrap(self, handler: Handler, *, admin: bool = False, query: tuple[str, ...] = ()) -> Handler:
        """``query``: the query parameters the route takes; any other is a 422."""

        async def guarded(request: Request) -> Response:
            try:
                principal = self.authenticate(request)
                unknown = sorted(set(request.query_params) - set(query))
                if unknown:
                    takes = ", ".join(query) or "none"
                    raise HttpError(
                        422,
                        "invalid_input",
                        f"unknown query parameter {unknown[0]!r}; this route takes: {takes}",
                    )
                if admin and not principal.is_admin:
                    raise HttpError(403, "forbidden", "this route needs an API key with the admin role")
                wait = self.rate.take(principal.user)
                if wait > 0:
                    raise HttpError(
                        429,
                        "rate_limited",
                        f"more than {self.limits.requests_per_second:g} requests/s; retry in {wait:.1f} s",
                        {"Retry-After": str(max(1, round(wait)))},
                    )
                request.state.principal = principal
                return await handler(request)
            except HttpError as exc:
                return error_response(exc)
            except TurnlogError as exc:
                return error_response(from_engine(exc, request.path_params.get("session_id", "")))

        return guarded


def principal_of(request: Request) -> Principal:
    principal: Principal = request.state.principal
    return principal


async def json_body(request: Request, max_bytes: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    raw = await request.body()
    if len(raw) > max_bytes:
        raise _too_large(len(raw), max_bytes)
    try:
        body = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, "bad_json", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(422, "invalid_input", "the body must be a JSON object")
    return body


def _too_large(size: int, limit: int) -> HttpError:
    return HttpError(413, "body_too_large", f"the request body is {size} bytes; the limit is {limit}")


def string_field(body: dict[str, Any], name: str, *, default: str | None = None, max_chars: int = 200) -> str:
    value = body.get(name, default)
    if not isinstance(value, str) or not value:
        raise HttpError(422, "invalid_input", f"'{name}' must be a non-empty string")
    if len(value) > max_chars:
        raise HttpError(422, "invalid_input", f"'{name}' is longer than {max_chars} characters")
    return value


def optional_string(body: dict[str, Any], name: str, *, max_chars: int = 500) -> str:
    """A string field that may be left out (then ""), e.g. a reason or a note."""
    if body.get(name) is None:
        return ""
    return string_field(body, name, max_chars=max_chars)


def int_field(body: dict[str, Any], name: str, *, low: int = 0, high: int = 2**62) -> int:
    value = body.get(name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema counts 342.0 as an integer
    if not isinstance(value, int) or isinstance(value, bool):
        raise HttpError(422, "invalid_input", f"'{name}' must be an integer")
    if not low <= value <= high:
        raise HttpError(422, "invalid_input", f"'{name}' must be in {low}..{high}")
    return value


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(422, "invalid_input", f"query parameter '{name}' must be an integer") from None
    if not low <= value <= high:
        raise HttpError(422, "invalid_input", f"query parameter '{name}' must be in {low}..{high}")
    return value
