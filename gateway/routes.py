"""The HTTP routes. Each handler is small: check who may see the session, call the engine's API
or read the projections, answer JSON (or an event stream)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from turnlog.consumers.health import health_answer
from turnlog.engine.session import MAX_MESSAGE_ID_CHARS
from turnlog.projections import queries

from .access import owned_state, projected, session_json, session_view, written
from .admin_routes import AdminRoutes
from .agui import AguiRoute
from .auth import ROLES
from .bodies import json_body
from .control import ControlRoutes
from .experiment_routes import ExperimentRoutes
from .http import HttpError, int_param, principal_of, string_field, whole_number
from .lifetimes import Holdings
from .model_request import sent_messages
from .parts import GatewayParts
from .stream import SessionStream
from .timeline import session_timeline
from .viewer import viewer_page

MAX_STEP = 10**6
"""Largest model call step a path may name (a turn makes at most a few dozen)."""


class Routes:
    def __init__(self, gw: GatewayParts) -> None:
        self.gw = gw

    def table(self) -> list[Route]:
        """Every route of the gateway: the session routes, the admin routes (metrics too), and the
        service's own (OpenAPI, viewer, health)."""
        return [*self._session_routes(), *self._admin_routes(), *self._service_routes()]

    def _session_routes(self) -> list[Route]:
        wrap = self.gw.guard.wrap
        control = ControlRoutes(self.gw)
        session = "/v1/sessions/{session_id}"
        return [
            Route(
                "/v1/sessions",
                _by_method(
                    {"POST": wrap(self.create_session), "GET": wrap(self.list_sessions, query=("limit",))}
                ),
                methods=["GET", "POST"],
            ),
            Route(session, wrap(self.get_session), methods=["GET"]),
            Route(f"{session}/history", wrap(self.get_history, query=("limit",)), methods=["GET"]),
            Route(f"{session}/timeline", wrap(self.get_timeline), methods=["GET"]),
            Route(
                f"{session}/model_calls/{{turn_id}}/{{step}}", wrap(self.get_model_request), methods=["GET"]
            ),
            Route(f"{session}/messages", wrap(self.post_message), methods=["POST"]),
            Route(f"{session}/events", wrap(self.stream_events, query=("after",)), methods=["GET"]),
            Route(f"{session}/cancel", wrap(control.cancel), methods=["POST"]),
            Route(f"{session}/interrupt", wrap(control.interrupt), methods=["POST"]),
            Route(f"{session}/approvals/{{call_id}}", wrap(control.decide), methods=["POST"]),
            Route(f"{session}/budget", wrap(control.decide_budget), methods=["POST"]),
            Route("/v1/agui/{agent}", wrap(AguiRoute(self.gw).run), methods=["POST"]),
        ]

    def _admin_routes(self) -> list[Route]:
        wrap = self.gw.guard.wrap
        admin = AdminRoutes(self.gw)
        experiments = ExperimentRoutes(self.gw)
        experiment = "/v1/admin/experiments/{experiment_id}"
        session = "/v1/admin/sessions/{session_id}"
        return [
            Route(
                "/v1/admin/sessions",
                wrap(admin.sessions, admin=True, query=("limit", "user", "state", "agent")),
                methods=["GET"],
            ),
            Route(session, wrap(admin.erase_session, admin=True, query=("reason",)), methods=["DELETE"]),
            Route(
                "/v1/admin/users/{user_id}",
                wrap(admin.erase_user, admin=True, query=("reason",)),
                methods=["DELETE"],
            ),
            Route(f"{session}/finish", wrap(admin.force_finish, admin=True), methods=["POST"]),
            Route(f"{session}/snapshots", wrap(admin.snapshots, admin=True), methods=["GET"]),
            Route(f"{session}/fork", wrap(admin.fork, admin=True), methods=["POST"]),
            Route(
                f"{session}/replay",
                wrap(admin.replay, admin=True, query=("after_version", "limit")),
                methods=["GET"],
            ),
            Route(
                "/v1/admin/analytics/daily",
                wrap(admin.analytics, admin=True, query=("days",)),
                methods=["GET"],
            ),
            Route(
                "/v1/admin/experiments",
                _by_method(
                    {"GET": wrap(experiments.list, admin=True), "POST": wrap(experiments.start, admin=True)}
                ),
                methods=["GET", "POST"],
            ),
            Route(experiment, wrap(experiments.report, admin=True, query=("all_turns",)), methods=["GET"]),
            Route(f"{experiment}/resume", wrap(experiments.resume, admin=True), methods=["POST"]),
            Route("/metrics", wrap(admin.metrics, admin=True), methods=["GET"]),
        ]

    def _service_routes(self) -> list[Route]:
        wrap = self.gw.guard.wrap
        return [
            Route("/openapi.json", wrap(self.openapi), methods=["GET"]),
            Route("/viewer", viewer_page, methods=["GET"]),
            Route("/healthz", self.health, methods=["GET"]),
            Route("/readyz", self.health, methods=["GET"]),
        ]

    # -- user routes -----------------------------------------------------------------------------

    async def create_session(self, request: Request) -> Response:
        principal = principal_of(request)
        body = await json_body(request, self.gw.limits)
        agent_id = string_field(body, "agent")
        role = string_field(body, "role", default="user", max_chars=20)
        if agent_id not in self.gw.api.agents:
            known = ", ".join(sorted(a.agent_id for a in self.gw.api.agents)) or "none"
            raise HttpError(422, "unknown_agent", f"no agent {agent_id!r}; known agents: {known}")
        if role not in ROLES:
            raise HttpError(422, "invalid_input", f"'role' must be one of {', '.join(ROLES)}, not {role!r}")
        if not principal.may_open(role):
            raise HttpError(
                403,
                "forbidden",
                f"a key with role {principal.role!r} cannot open a session with role {role!r}",
            )
        metadata = body.get("metadata", {})
        if not isinstance(metadata, dict):
            raise HttpError(422, "invalid_input", "'metadata' must be a JSON object")
        info = await self.gw.api.create_session(agent_id, principal.user, role=role, metadata=metadata)
        record = info.record  # on the log: on Kafka, from a process that owns no partition, sequenced by now
        if record is not None:
            self.gw.hub.publish(record.event)
        return JSONResponse(
            {
                "session_id": info.session_id,
                "agent": info.agent_id,
                "user": info.user_id,
                "role": info.role,
                "status": info.status,
                "version": info.version,
                "position": None if record is None else record.offset,
                "partition": None if record is None else record.partition,
            },
            201,
        )

    async def list_sessions(self, request: Request) -> Response:
        principal = principal_of(request)
        limit = int_param(request, "limit", 50, 1, 500)
        await self.gw.catch_up_projections()
        rows = queries.list_sessions(self.gw.store, user_id=principal.user, limit=limit)
        return JSONResponse({"sessions": [session_json(r, self.gw.api.agents) for r in rows]})

    async def get_session(self, request: Request) -> Response:
        state = await owned_state(self.gw, request)
        return JSONResponse(await session_view(self.gw, state))

    async def get_history(self, request: Request) -> Response:
        state = await owned_state(self.gw, request)
        limit = int_param(request, "limit", 50, 1, 1000)
        session = await projected(self.gw, state)
        messages = queries.last_messages(self.gw.store, state.session_id, limit)
        return JSONResponse({"session": session, "messages": messages})

    async def get_timeline(self, request: Request) -> Response:
        state = await owned_state(self.gw, request)
        session = await session_view(self.gw, state)
        rows = await session_timeline(
            self.gw.log, self.gw.store, self.gw.api.agents, state.session_id, state.agent_id
        )
        return JSONResponse({"session": session, **rows})

    async def get_model_request(self, request: Request) -> Response:
        state = await owned_state(self.gw, request)
        turn_id, raw_step = request.path_params["turn_id"], request.path_params["step"]
        step = whole_number(raw_step, 0, MAX_STEP)
        if step is None:
            raise HttpError(
                422, "invalid_input", f"step must be a whole number in 0..{MAX_STEP}, not {raw_step[:40]!r}"
            )
        sent = await sent_messages(self.gw.log, self.gw.api.agents, state.session_id, turn_id, step)
        if sent is None:
            raise HttpError(
                404, "not_found", f"session {state.session_id} has no model call {step} in turn {turn_id}"
            )
        return JSONResponse(sent)

    async def post_message(self, request: Request) -> Response:
        state = await owned_state(self.gw, request)
        body = await json_body(request, self.gw.limits)
        text = body.get("text")
        if not isinstance(text, str):
            raise HttpError(422, "invalid_input", "'text' must be a string")
        message_id = None
        if body.get("message_id") is not None:  # the client's own id: a retry is taken once
            message_id = string_field(body, "message_id", max_chars=MAX_MESSAGE_ID_CHARS)
        posted = await self.gw.api.post_user_message(
            state.session_id, text, message_id=message_id, state=state
        )
        (answer,) = written(self.gw, [posted])
        fields = ("session_id", "message_id", "version", "position", "partition")
        body = {key: answer[key] for key in fields}
        if posted.event.session_id != state.session_id:  # the expired session's successor took it
            body["continued_from"] = state.session_id
        return JSONResponse(body, 202)

    async def stream_events(self, request: Request) -> Response:
        """The session's events over SSE. The stream's slot and hub subscription belong to the
        answer (gateway.lifetimes); a HEAD is answered with the headers and opens nothing."""
        state = await owned_state(self.gw, request)
        after = _last_event_id(request)
        if request.method == "HEAD":
            return _event_stream(_no_events())
        user = principal_of(request).user
        with Holdings() as held:
            held.hold(self._stream_slot(user))
            stream = SessionStream(
                self.gw.log, self.gw.hub, state.session_id, after, poll_s=self.gw.config.poll_s
            )
            held.hold(stream.close)
            return held.answer(_event_stream(_sse(stream), ping_s=self.gw.config.ping_s))

    def _stream_slot(self, user: str) -> Callable[[], None]:
        release = self.gw.streams.take(user)
        if release is None:
            raise HttpError(
                429,
                "too_many_streams",
                f"you already have {self.gw.limits.streams_per_user} event streams open; close one first",
            )
        return release

    async def health(self, request: Request) -> Response:
        """Liveness (``/healthz``) and readiness (``/readyz``): no key, no session data."""
        status, body = await health_answer(self.gw.readiness, request.url.path)
        return JSONResponse(body, status, headers={"Cache-Control": "no-store"})

    async def openapi(self, request: Request) -> Response:
        from .openapi import document

        return JSONResponse(document([a.agent_id for a in self.gw.api.agents]))


async def _sse(stream: SessionStream) -> AsyncIterator[bytes]:
    """The stream's messages, what was ready together in one write (a commit's events)."""
    async for batch in stream.message_batches():
        yield b"".join(m.encode() for m in batch)


async def _no_events() -> AsyncIterator[bytes]:
    return
    yield  # an async generator that yields nothing (never started: a HEAD has no body)


def _event_stream(events: AsyncIterator[bytes], ping_s: float = 15.0) -> Response:
    return EventSourceResponse(events, ping=ping_s, headers={"Cache-Control": "no-store"})


def _by_method(handlers: dict[str, Any]) -> Any:
    """One route per path, so a wrong method gets a 405 whose Allow lists every method of the path."""

    async def dispatch(request: Request) -> Response:
        handler = handlers.get(request.method) or handlers["GET"]  # HEAD goes to GET
        response: Response = await handler(request)
        return response

    return dispatch


def _last_event_id(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("after")
    if raw is None or raw == "":
        return -1
    position = whole_number(raw, -1, 2**62)
    if position is None:
        raise HttpError(
            400,
            "bad_last_event_id",
            f"Last-Event-ID must be a log position (a whole number >= -1), not {raw[:40]!r}",
        )
    return position
