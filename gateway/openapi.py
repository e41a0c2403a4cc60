"""The OpenAPI 3.1 document of the gateway, served at /openapi.json.

Written out rather than generated: the routes are few, and tests/test_gateway_http.py checks
that every route of the app is described here and nothing else is. The bodies' schemas are in
``openapi_schemas``.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from .openapi_schemas import SCHEMAS, ref

JSON = "application/json"


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "malformed request: not JSON, JSON nested over 32 levels or with a number over 40 "
        "characters, text that is not valid Unicode, a bad Last-Event-ID",
        401: "no or unknown API key",
        403: "the key's role does not allow this",
        404: "no such session, or not yours (the same answer)",
        409: "the session is closed (`session_expired`: closed after a time without activity), or a "
        "concurrent write won",
        413: "body or message too large",
        422: "invalid field",
        429: "rate limit or open-stream limit reached",
        503: "the log cannot take the write now (retry after Retry-After)",
    }
    return {str(c): _json(ref("Error"), text[c]) for c in (401, 429, *codes)}


SESSION_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
EXPERIMENT_ID = {"name": "experiment_id", "in": "path", "required": True, "schema": {"type": "string"}}
REASON = {
    "name": "reason",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "maxLength": 500},
    "description": "why, recorded on the log as metadata (put no personal data in it)",
}


def _limit(default: int, high: int) -> dict[str, Any]:
    return {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": high, "default": default},
    }


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": schema}}}


PATHS: dict[str, dict[str, Any]] = {
    "/v1/sessions": {
        "post": {
            "summary": "Open a session with an agent; its role cannot exceed your key's role",
            "operationId": "createSession",
            "requestBody": _body(ref("CreateSession")),
            "responses": {
                "201": _json(ref("Created"), "the session, durable on the log"),
                **_errors(400, 403, 413, 422),
            },
        },
        "get": {
            "summary": "Your sessions, newest first (from the projections)",
            "operationId": "listSessions",
            "parameters": [_limit(50, 500)],
            "responses": {"200": _json(ref("SessionList"), "sessions"), **_errors(422)},
        },
    },
    "/v1/sessions/{session_id}": {
        "get": {
            "summary": "One session (from the projections)",
            "operationId": "getSession",
            "parameters": [SESSION_ID],
            "responses": {"200": _json(ref("Session"), "the session"), **_errors(404)},
        }
    },
    "/v1/sessions/{session_id}/history": {
        "get": {
            "summary": "The session and its last messages, oldest first (from the projections)",
            "operationId": "getHistory",
            "parameters": [SESSION_ID, _limit(50, 1000)],
            "responses": {"200": _json(ref("History"), "history"), **_errors(404, 422)},
        }
    },
    "/v1/sessions/{session_id}/timeline": {
        "get": {
            "summary": "What the session did: turns, model calls, tool calls, state changes, messages",
            "description": "From the projections: every model call (tokens, cost, latency, status; its log "
            "version and retries added from the log), every tool call (arguments, result, status, duration, "
            "attempts, approval) and every state transition with its cause; `events` lists from the log "
            "every event of a kind those rows do not show.",
            "operationId": "getTimeline",
            "parameters": [SESSION_ID],
            "responses": {"200": _json(ref("Timeline"), "timeline"), **_errors(404)},
        }
    },
    "/v1/sessions/{session_id}/model_calls/{turn_id}/{step}": {
        "get": {
            "summary": "The messages one model call was sent, rebuilt from the log",
            "operationId": "getModelRequest",
            "parameters": [
                SESSION_ID,
                {"name": "turn_id", "in": "path", "required": True, "schema": {"type": "string"}},
                {
                    "name": "step",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 0, "maximum": 10**6},
                },
            ],
            "responses": {
                "200": _json({"type": "object"}, "model, message_count, exact, messages"),
                **_errors(404, 422),
            },
        }
    },
    "/v1/sessions/{session_id}/messages": {
        "post": {
            "summary": "Append a user message; answers with its log position, never waits for the turn",
            "operationId": "postMessage",
            "parameters": [SESSION_ID],
            "requestBody": _body(ref("PostMessage")),
            "responses": {
                "202": _json(ref("Posted"), "durable on the log"),
                **_errors(400, 404, 409, 413, 422),
            },
        }
    },
    "/v1/sessions/{session_id}/events": {
        "get": {
            "summary": "Session events as Server-Sent Events (id = log position; resume: Last-Event-ID)",
            "description": (
                "Each log event is sent as `event: <EventType>`, `id: <position>`, `data: <event JSON>`, "
                "with a "
                "`phase` (turn.start, turn.end, model.start, model.end, tool.start, tool.end) where it marks "
                "one. Token deltas are sent as `event: delta` without an id and are not replayed; a model "
                "call waiting for its endpoint's client-side limits as `event: waiting` (`{turn_id, step, "
                "model, reason, ahead, waiting}`, `waiting: false` when the wait is over), the same way."
            ),
            "operationId": "streamEvents",
            "parameters": [
                SESSION_ID,
                {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "integer"}},
                {"name": "after", "in": "query", "required": False, "schema": {"type": "integer"}},
            ],
            "responses": {
                "200": {
                    "description": "event stream",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **_errors(400, 404),
            },
        }
    },
    "/v1/sessions/{session_id}/cancel": {
        "post": {
            "summary": "Cancel the running turn (it stops at its next step boundary: CANCELLED) and drop "
            "the messages waiting for a turn",
            "description": "Appends a CancelRequested and, in the same commit, a UserMessageDropped (reason "
            "`cancelled`) for every message received and not yet taken by a turn, so a cancel sent right "
            "after a post drops that message and nothing answers it. Answers what it did: `stopped_turn` "
            "and `dropped`; never waits for the turn. 409 `no_turn_running` when no turn runs and no "
            "message waits, `session_closed` when the session is closed.",
            "operationId": "cancelTurn",
            "parameters": [SESSION_ID],
            "requestBody": _body(ref("Cancel")),
            "responses": {
                "202": _json(ref("Cancelled"), "the CancelRequested and the drops, durable on the log"),
                **_errors(400, 404, 409, 413, 422, 503),
            },
        }
    },
    "/v1/sessions/{session_id}/interrupt": {
        "post": {
            "summary": "Post a message that stops the running turn; it starts the next turn",
            "description": "A cancel (if a turn runs or messages wait: it stops the turn and drops the "
            "waiting messages, as `/cancel` does), then the message, both appended before the answer; the "
            "stopped turn ends CANCELLED and the message's turn sees what it did. With no turn running and "
            "no message waiting it is a plain message (`interrupted: false`).",
            "operationId": "interruptTurn",
            "parameters": [SESSION_ID],
            "requestBody": _body(ref("PostMessage")),
            "responses": {
                "202": _json(ref("Interrupted"), "the cancel (if any) and the message, durable on the log"),
                **_errors(400, 404, 409, 413, 422, 503),
            },
        }
    },
    "/v1/sessions/{session_id}/approvals/{call_id}": {
        "post": {
            "summary": "Approve, edit or reject a tool call waiting for a decision (PAUSED_FOR_USER)",
            "description": "`edit` runs the call with `arguments`, validated against the tool first (422 "
            "`invalid_arguments` naming the field). The last decision of a batch resumes the turn, which a "
            "worker carries on. 404 `unknown_call` for a call the session does not have, 409 "
            "`not_awaiting_approval` for one already decided (the detail names its decision) or "
            "that needs none.",
            "operationId": "decideToolCall",
            "parameters": [
                SESSION_ID,
                {"name": "call_id", "in": "path", "required": True, "schema": {"type": "string"}},
            ],
            "requestBody": _body(ref("Decision")),
            "responses": {
                "202": _json(ref("Appended"), "the ApprovalDecided (and the resume transition)"),
                **_errors(400, 404, 409, 413, 422, 503),
            },
        }
    },
    "/v1/sessions/{session_id}/budget": {
        "post": {
            "summary": "Raise the allowance of a turn paused on its budget, or stop it (PAUSED_FOR_USER)",
            "description": 'For agents whose `Budget(on_exceed="pause")`: `raise` lets the turn spend '
            "`extra_micros` (micro-dollars) more and a worker carries it on; `stop` ends it, cause budget. "
            "409 `not_awaiting_approval` when no turn waits on its budget.",
            "operationId": "decideBudget",
            "parameters": [SESSION_ID],
            "requestBody": _body(ref("BudgetDecision")),
            "responses": {
                "202": _json(ref("Appended"), "the BudgetDecided and what follows it"),
                **_errors(400, 404, 409, 413, 422, 503),
            },
        }
    },
    "/v1/admin/sessions": {
        "get": {
            "summary": "Every user's sessions, filtered (admin)",
            "operationId": "adminListSessions",
            "parameters": [
                _limit(50, 500),
                *(
                    {"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
                    for n in ("user", "state", "agent")
                ),
            ],
            "responses": {"200": _json(ref("SessionList"), "sessions"), **_errors(403, 422)},
        }
    },
    "/v1/admin/users/{user_id}": {
        "delete": {
            "summary": "Erase a user: the content of every session of theirs, for good (admin)",
            "description": "Destroys the sessions' keys (their content reads `[erased]` everywhere: log, "
            "projections, viewer, exports), deletes their long-term memories, stops a running turn first. "
            "Metadata (tokens, costs, states) stays. Durable and idempotent: a repeat answers erased_now 0.",
            "operationId": "eraseUser",
            "parameters": [
                {"name": "user_id", "in": "path", "required": True, "schema": {"type": "string"}},
                REASON,
            ],
            "responses": {"200": _json(ref("Erasure"), "the erasure, done"), **_errors(403, 409, 422, 503)},
        }
    },
    "/v1/admin/sessions/{session_id}": {
        "delete": {
            "summary": "Erase one session's content, for good (admin)",
            "operationId": "eraseSession",
            "parameters": [SESSION_ID, REASON],
            "responses": {
                "200": _json(ref("Erasure"), "the erasure, done"),
                **_errors(403, 404, 409, 422, 503),
            },
        }
    },
    "/v1/admin/sessions/{session_id}/finish": {
        "post": {
            "summary": "Force-finish a session: end its turn and close it (admin)",
            "operationId": "forceFinish",
            "parameters": [SESSION_ID],
            "requestBody": _body(ref("Finish")),
            "responses": {
                "200": _json(ref("Session"), "the closed session"),
                **_errors(400, 403, 404, 409, 413, 422),
            },
        }
    },
    "/v1/admin/sessions/{session_id}/snapshots": {
        "get": {
            "summary": "A session's snapshots, oldest first (admin)",
            "operationId": "listSnapshots",
            "parameters": [SESSION_ID],
            "responses": {"200": _json(ref("SnapshotList"), "snapshots"), **_errors(403, 404)},
        }
    },
    "/v1/admin/sessions/{session_id}/fork": {
        "post": {
            "summary": "Fork a new session from the snapshot at `version`, maybe with another agent (admin)",
            "description": "The fork belongs to the origin's user and starts with its history and state at "
            "the snapshot; the origin is not touched. A mid-turn snapshot needs `unfinished`: `continue` "
            "(a worker carries the turn on now) or `rest`. A message posted to the fork continues it.",
            "operationId": "forkSession",
            "parameters": [SESSION_ID],
            "requestBody": _body(ref("Fork")),
            "responses": {
                "201": _json(ref("Forked"), "the fork's SessionForked, durable on the log"),
                **_errors(400, 403, 404, 409, 413, 422, 503),
            },
        }
    },
    "/v1/admin/sessions/{session_id}/replay": {
        "get": {
            "summary": "Replay a session read-only: its events, each with the state folded up to it (admin)",
            "operationId": "replaySession",
            "parameters": [
                SESSION_ID,
                {
                    "name": "after_version",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0, "default": 0},
                },
                _limit(200, 1000),
            ],
            "responses": {"200": _json(ref("Replay"), "one page of steps"), **_errors(403, 404, 422)},
        }
    },
    "/v1/admin/experiments": {
        "get": {
            "summary": "The experiments on the log (admin)",
            "operationId": "listExperiments",
            "responses": {"200": _json(ref("ExperimentList"), "experiments, oldest first"), **_errors(403)},
        },
        "post": {
            "summary": "Replay recorded sessions against one of this gateway's agents; what changes (admin)",
            "description": "Selects the sessions (`select`), writes the experiment's definition to the log "
            "and replays them in this process in the background, tools answered from the recording (a tool "
            "that is not idempotent is never run). Read the report at `report` while it runs.",
            "operationId": "startExperiment",
            "requestBody": _body(ref("ExperimentStart")),
            "responses": {
                "202": _json(ref("ExperimentStarted"), "defined and running"),
                **_errors(400, 403, 404, 413, 422, 503),
            },
        },
    },
    "/v1/admin/experiments/{experiment_id}": {
        "get": {
            "summary": "An experiment's report from the log: per session and turn, what differs (admin)",
            "operationId": "experimentReport",
            "parameters": [
                EXPERIMENT_ID,
                {
                    "name": "all_turns",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
                },
            ],
            "responses": {"200": _json(ref("ExperimentReport"), "the report"), **_errors(403, 404, 422)},
        }
    },
    "/v1/admin/experiments/{experiment_id}/resume": {
        "post": {
            "summary": "Carry on a stopped experiment; finished sessions are not replayed again (admin)",
            "operationId": "resumeExperiment",
            "parameters": [EXPERIMENT_ID],
            "responses": {
                "202": _json(ref("ExperimentStarted"), "running"),
                **_errors(403, 404, 409, 503),
            },
        }
    },
    "/v1/admin/analytics/daily": {
        "get": {
            "summary": "Daily aggregates from the analytics consumer (admin)",
            "operationId": "dailyAnalytics",
            "parameters": [
                {
                    "name": "days",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 1, "maximum": 3660, "default": 30},
                }
            ],
            "responses": {"200": _json({"type": "object"}, "days and per-tool rows"), **_errors(403, 422)},
        }
    },
    "/v1/agui/{agent}": {
        "post": {
            "summary": "AG-UI 1.0: a RunAgentInput in, the run's AG-UI events out (Server-Sent Events)",
            "description": (
                "The thread is a session of the caller's (its id is a hash of user and threadId); the last "
                "user message of `messages` is posted and its turn streamed as RUN_STARTED, STATE_SNAPSHOT, "
                "STATE_DELTA, STEP_*, TEXT_MESSAGE_*, TOOL_CALL_*, then RUN_FINISHED or RUN_ERROR."
            ),
            "operationId": "aguiRun",
            "parameters": [{"name": "agent", "in": "path", "required": True, "schema": {"type": "string"}}],
            "requestBody": _body({"type": "object", "description": "AG-UI RunAgentInput"}),
            "responses": {
                "200": {
                    "description": "AG-UI event stream",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **_errors(400, 404, 409, 413, 422),
            },
        }
    },
    "/metrics": {
        "get": {
            "summary": "Prometheus metrics (admin)",
            "operationId": "metrics",
            "responses": {
                "200": {
                    "description": "Prometheus text format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **_errors(403),
            },
        }
    },
    "/viewer": {
        "get": {
            "summary": "The trace viewer page (static: loads without a key; every call it makes sends one)",
            "operationId": "viewer",
            "security": [],
            "responses": {
                "200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}
            },
        }
    },
    "/healthz": {
        "get": {
            "summary": "Liveness: the process answers (no key, no session data)",
            "operationId": "healthz",
            "security": [],
            "responses": {"200": _json({"$ref": "#/components/schemas/Alive"}, "alive")},
        }
    },
    "/readyz": {
        "get": {
            "summary": "Readiness: the log answers, the schemas load, the projections are within their lag "
            "bound, not draining after SIGTERM (no key, no session data)",
            "operationId": "readyz",
            "security": [],
            "responses": {
                "200": _json({"$ref": "#/components/schemas/Readiness"}, "ready"),
                "503": _json({"$ref": "#/components/schemas/Readiness"}, "not ready: what each check says"),
            },
        }
    },
    "/openapi.json": {
        "get": {
            "summary": "This document",
            "operationId": "openapi",
            "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1"), **_errors()},
        }
    },
}


def document(agents: Sequence[str] = ()) -> dict[str, Any]:
    """The document; ``agents`` (the configured agent ids) become the enum of ``agent``."""
    schemas = copy.deepcopy(SCHEMAS)
    if agents:
        for name in ("CreateSession", "Fork", "ExperimentStart"):
            schemas[name]["properties"]["agent"]["enum"] = sorted(agents)
    return {
        "openapi": "3.1.0",
        "info": {"title": "turnlog gateway", "version": "1"},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"apiKey": []}],
        "paths": PATHS,
    }
