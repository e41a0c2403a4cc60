"""Admin routes (the admin role only): every user's sessions, force-finish, a session's snapshots,
a fork from one of them, a read-only replay, erasure of a user or a session, the analytics and
the metrics."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from turnlog.engine.admin import SessionAdmin, Unfinished
from turnlog.engine.erasure import Eraser
from turnlog.engine.fold import SessionState, fold
from turnlog.projections import queries

from .access import event_json, owned_state, pending_approvals, projected, session_json, written
from .bodies import json_body
from .http import HttpError, int_field, int_param, optional_string, principal_of, string_field
from .parts import GatewayParts

REPLAY_PAGE = 200
"""Default number of replay steps per page."""


class AdminRoutes:
    def __init__(self, gw: GatewayParts) -> None:
        self.gw = gw
        self.admin = SessionAdmin(gw.log, producer="gateway-admin")

    async def sessions(self, request: Request) -> Response:
        limit = int_param(request, "limit", 50, 1, 500)
        await self.gw.catch_up_projections()
        params = request.query_params
        rows = queries.list_sessions(
            self.gw.store,
            user_id=params.get("user"),
            state=params.get("state"),
            agent_id=params.get("agent"),
            limit=limit,
        )
        return JSONResponse({"sessions": [session_json(r, self.gw.api.agents) for r in rows]})

    async def force_finish(self, request: Request) -> Response:
        state = await owned_state(self.gw, request)
        body = await json_body(request, self.gw.limits)
        reason = string_field(body, "reason", default="finished by an admin", max_chars=500)
        await self.gw.api.force_finish(state.session_id, reason, actor=principal_of(request).user)
        for record in await self.gw.log.read_session_records(state.session_id, state.version):
            self.gw.hub.publish(record.event)
        return JSONResponse(await projected(self.gw, await self.gw.api.get_state(state.session_id)))

    async def snapshots(self, request: Request) -> Response:
        state = await owned_state(self.gw, request)
        found = await self.admin.snapshots(state.session_id)
        return JSONResponse(
            {"session_id": state.session_id, "snapshots": [dataclasses.asdict(s) for s in found]}
        )

    async def fork(self, request: Request) -> Response:
        """A new session (the origin's user owns it) from the snapshot at ``version``, optionally
        with another agent; the origin is never touched. A mid-turn snapshot needs
        ``"unfinished": "continue" | "rest"`` (engine.admin); ``events`` is all the fork wrote."""
        state = await owned_state(self.gw, request)
        body = await json_body(request, self.gw.limits)
        version = int_field(body, "version", low=1)
        agent_id = body.get("agent")
        model = None
        if agent_id is not None:
            agent_id = string_field(body, "agent")
            if agent_id not in self.gw.api.agents:
                known = ", ".join(sorted(a.agent_id for a in self.gw.api.agents)) or "none"
                raise HttpError(422, "unknown_agent", f"no agent {agent_id!r}; known agents: {known}")
            model = self.gw.api.agents.get(agent_id).model.name
        unfinished = optional_string(body, "unfinished", max_chars=20)
        if unfinished not in ("", "continue", "rest"):
            raise HttpError(422, "invalid_input", "'unfinished' must be 'continue' or 'rest'")
        choice = cast(Unfinished, unfinished) if unfinished else None
        records = await self.admin.fork_events(
            state.session_id, version, unfinished=choice, agent_id=agent_id, model=model
        )
        if records[0].pending:  # submitted: on Kafka its owner writes it (and what settles it)
            forked = await self.gw.api.on_log(records[0], "the fork")
            records = await self.gw.log.read_session_records(forked.event.session_id)
        answer = written(self.gw, records)
        events = [r.event for r in records]
        fork_state = fold(events[0].session_id, events)  # as forked (a worker may carry it on already)
        return JSONResponse(
            {
                **answer[0],
                "events": answer,
                "user_id": fork_state.user_id,
                "status": str(fork_state.status),
                "turn_running": fork_state.turn is not None,
            },
            201,
        )

    async def replay(self, request: Request) -> Response:
        """One page of the session's events, each with the session as folded up to it."""
        state = await owned_state(self.gw, request)
        after = int_param(request, "after_version", 0, 0, 2**62)
        limit = int_param(request, "limit", REPLAY_PAGE, 1, 1000)
        steps: list[dict[str, Any]] = []
        more = False
        async for step in self.admin.replay(state.session_id, from_version=after):
            if len(steps) == limit:
                more = True
                break
            steps.append({"event": event_json(step.event), "state": state_summary(step.state)})
        next_after = steps[-1]["event"]["version"] if more else None
        return JSONResponse(
            {"session_id": state.session_id, "steps": steps, "next_after_version": next_after}
        )

    async def erase_user(self, request: Request) -> Response:
        """Erase every session of a user (engine.erasure): their content is gone from the log's
        reading, the projections and long-term memory; metadata stays. Idempotent."""
        user_id = request.path_params["user_id"]
        report = await self._eraser().erase_user(user_id, _reason(request), actor=principal_of(request).user)
        return JSONResponse(dataclasses.asdict(report))

    async def erase_session(self, request: Request) -> Response:
        """Erase one session (any user's: an admin route). Idempotent."""
        session_id = request.path_params["session_id"]
        eraser = self._eraser()
        report = await eraser.erase_session(session_id, _reason(request), actor=principal_of(request).user)
        return JSONResponse(dataclasses.asdict(report))

    def _eraser(self) -> Eraser:
        if self.gw.eraser is None:
            raise HttpError(
                409,
                "erasure_unavailable",
                "this deployment's log does not encrypt content, so nothing can be erased: on Kafka set "
                "TURNLOG_KEYSTORE (a PostgreSQL DSN) and a master key in every process",
            )
        return self.gw.eraser

    async def analytics(self, request: Request) -> Response:
        days = int_param(request, "days", 30, 1, 3660)
        await self.gw.catch_up_analytics()
        return JSONResponse(self.gw.analytics.report(days))

    async def metrics(self, request: Request) -> Response:
        body, content_type = await self.gw.metrics.render()
        return Response(body, media_type=content_type)


def _reason(request: Request) -> str:
    """Why (``?reason=``, at most 500 characters; recorded on the log as metadata: no personal data)."""
    reason = request.query_params.get("reason", "") or "erased by an admin"
    if len(reason) > 500 or "\x00" in reason:
        raise HttpError(422, "invalid_input", "'reason' is at most 500 characters, without NUL")
    return reason


def state_summary(state: SessionState) -> dict[str, Any]:
    """The folded session after one replayed event: what a reader of a replay looks at."""
    return {
        "version": state.version,
        "status": str(state.status),
        "turn_id": state.turn.turn_id if state.turn is not None else None,
        "turns_finished": state.turns_finished,
        "message_count": len(state.messages),
        "waiting_messages": len(state.inbox),
        "pending_approvals": [c["call_id"] for c in pending_approvals(state)],
        "input_tokens": state.input_tokens,
        "output_tokens": state.output_tokens,
        "cost_micros": state.cost_micros,
        "closed": state.closed,
    }
