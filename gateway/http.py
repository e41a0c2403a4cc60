"""HTTP plumbing shared by the routes: error answers (the routes' own, the router's and the last
resort's, all ``{"error", "detail"}``), authentication, limits, security headers."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnlog.engine.errors import (
    ApprovalError,
    ConcurrencyError,
    ExperimentNotFoundError,
    InputError,
    InvalidArgumentsError,
    KeyStoreError,
    LogUnavailableError,
    MessageTooLargeError,
    NoSessionsSelectedError,
    NotAwaitingBudgetError,
    NoTurnRunningError,
    SessionClosedError,
    SessionErasedError,
    SessionExpiredError,
    SessionNotFoundError,
    SnapshotFormatError,
    SnapshotNotFoundError,
    TurnlogError,
)
from turnlog.engine.text import text_problem

from .auth import KeyStore, Principal
from .limits import Limits, RateLimiter

Handler = Callable[[Request], Awaitable[Response]]
log = structlog.get_logger("turnlog.gateway")

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)
"""Sent with every answer; the viewer page adds its Content-Security-Policy."""


class HttpError(Exception):
    """An answer other than success; becomes ``{"error": code, "detail": detail}``."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}


def error_response(exc: HttpError) -> Response:
    """The one shape of every refusal. ASCII-escaped JSON, so no detail can fail to encode."""
    body = json.dumps({"error": exc.code, "detail": exc.detail})
    return Response(body, exc.status, headers=exc.headers, media_type="application/json")


async def router_error(request: Request, exc: Exception) -> Response:
    """The router's own refusals (no such path, a method the path does not take) in our shape."""
    assert isinstance(exc, HTTPException)
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        error = HttpError(404, "not_found", f"no route {where}; /openapi.json lists the routes")
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        detail = f"{request.url.path} does not take {request.method}; it takes {allowed}"
        error = HttpError(405, "method_not_allowed", detail)
    else:
        error = HttpError(exc.status_code, "bad_request", str(exc.detail))
    error.headers.update(exc.headers or {})
    return error_response(error)


async def internal_error(request: Request, exc: Exception) -> Response:
    """The last resort: a bug. Logged with its traceback; the client gets our shape, no internals."""
    log.error("gateway.internal_error", method=request.method, path=request.url.path, exc_info=exc)
    return error_response(
        HttpError(500, "internal", "the gateway failed on this request; the error is in its log")
    )


class SecurityHeaders:
    """ASGI middleware: ``SECURITY_HEADERS`` on every answer that does not set them itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [h for h in SECURITY_HEADERS if h[0] not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def not_found(session_id: str) -> HttpError:
    """The one answer for a missing session and for another user's: nothing tells them apart."""
    return HttpError(404, "not_found", f"no session {session_id}")


ENGINE_ERRORS: tuple[tuple[type[TurnlogError], int, str], ...] = (
    (MessageTooLargeError, 413, "message_too_large"),
    (InvalidArgumentsError, 422, "invalid_arguments"),
    (ExperimentNotFoundError, 404, "experiment_not_found"),
    (NoSessionsSelectedError, 404, "no_sessions_selected"),
    (InputError, 422, "invalid_input"),
    (SessionExpiredError, 409, "session_expired"),
    (SessionClosedError, 409, "session_closed"),
    (SessionErasedError, 409, "session_erased"),
    (NoTurnRunningError, 409, "no_turn_running"),
    (ApprovalError, 409, "not_awaiting_approval"),
    (NotAwaitingBudgetError, 409, "not_awaiting_budget"),
    (SnapshotNotFoundError, 404, "snapshot_not_found"),
    (SnapshotFormatError, 409, "snapshot_unreadable"),
    (LogUnavailableError, 503, "log_unavailable"),
    (KeyStoreError, 503, "key_store_unavailable"),
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
    log.error("gateway.unmapped_engine_error", error=f"{type(exc).__name__}: {exc}")
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
                _check_query(request, query)
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


def string_field(body: dict[str, Any], name: str, *, default: str | None = None, max_chars: int = 200) -> str:
    """A string the log keeps as text: non-empty, bounded, no NUL (nor a lone surrogate)."""
    value = body.get(name, default)
    if not isinstance(value, str) or not value:
        raise HttpError(422, "invalid_input", f"'{name}' must be a non-empty string")
    if len(value) > max_chars:
        raise HttpError(422, "invalid_input", f"'{name}' is longer than {max_chars} characters")
    problem = text_problem(value)
    if problem is not None:
        raise HttpError(422, "invalid_input", f"'{name}' holds {problem}; send plain text")
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
    value = whole_number(raw, low, high)
    if value is None:
        raise HttpError(
            422, "invalid_input", f"query parameter '{name}' must be a whole number in {low}..{high}"
        )
    return value


def whole_number(raw: str, low: int, high: int) -> int | None:
    """``raw`` as an integer in ``low..high``, or None. ASCII digits only (``int`` also takes
    "١٢", " 12 " and "1_2"), and never more of them than the bounds have, so nothing huge is parsed."""
    digits = raw[1:] if raw.startswith("-") and low < 0 else raw
    if not (digits.isascii() and digits.isdigit()) or len(digits) > len(str(max(-low, high))):
        return None
    value = int(raw)
    return value if low <= value <= high else None


def _check_query(request: Request, takes: tuple[str, ...]) -> None:
    """Only the route's own query parameters, and no NUL in them (PostgreSQL text cannot hold one)."""
    unknown = sorted(set(request.query_params) - set(takes))
    if unknown:
        raise HttpError(
            422,
            "invalid_input",
            f"unknown query parameter {unknown[0]!r}; this route takes: {', '.join(takes) or 'none'}",
        )
    for name, value in request.query_params.multi_items():
        if "\x00" in value:
            raise HttpError(422, "invalid_input", f"query parameter {name!r} holds a NUL character")
