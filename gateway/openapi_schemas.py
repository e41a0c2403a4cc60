"""The request and response bodies of the gateway's OpenAPI document (``components/schemas``)."""

from __future__ import annotations

from typing import Any


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


NO_NUL = "^[^\\u0000]*$"
"""Text fields are stored as text, which cannot hold a NUL character."""

STOPPED_TURN = {
    "type": ["string", "null"],
    "description": "the running turn the cancel stops at its next step boundary (null: none ran)",
}
DROPPED = {
    "type": "array",
    "items": {"type": "string"},
    "description": "the ids of the messages the cancel dropped (UserMessageDropped, reason cancelled): they "
    "were waiting for a turn, and no turn will answer them",
}

NOTE = {
    "type": "string",
    "minLength": 1,
    "maxLength": 2000,
    "pattern": NO_NUL,
    "description": "why; a rejection's note reaches the model",
}

POSITION = {
    "type": ["integer", "null"],
    "description": "the event's offset in its partition; null (with version 0) when the log has taken "
    "it but not sequenced it yet (Kafka, from a process that does not own the session's partition)",
}


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error", "detail"],
        "properties": {"error": {"type": "string"}, "detail": {"type": "string"}},
    },
    "Alive": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "const": "alive"}},
    },
    "Readiness": {
        "type": "object",
        "required": ["ready", "checks"],
        "properties": {
            "ready": {"type": "boolean"},
            "checks": {
                "type": "object",
                "description": "each check's answer: ok, or what is wrong and what to do",
                "additionalProperties": {"type": "string"},
            },
        },
    },
    "CreateSession": {
        "type": "object",
        "required": ["agent"],
        "properties": {
            "agent": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_NUL},
            "role": {"type": "string", "enum": ["user", "admin"], "default": "user"},
            "metadata": {"type": "object"},
        },
    },
    "Created": {
        "type": "object",
        "required": ["session_id", "agent", "user", "role", "status", "version", "position", "partition"],
        "properties": {
            "session_id": {"type": "string"},
            "agent": {"type": "string"},
            "user": {"type": "string"},
            "role": {"type": "string"},
            "status": {"type": "string"},
            "version": {"type": "integer"},
            "position": POSITION,
            "partition": {"type": ["integer", "null"]},
        },
    },
    "PostMessage": {
        "type": "object",
        "required": ["text"],
        "properties": {
            "text": {
                "type": "string",
                "pattern": "^[^\\u0000]*\\S[^\\u0000]*$",
                "description": "not blank, no NUL; at most the agent's max_message_bytes in UTF-8 "
                "(64 KiB by default; 413 above it)",
            },
            "message_id": {
                "type": "string",
                "minLength": 1,
                "maxLength": 128,
                "pattern": NO_NUL,
                "description": (
                    "optional, chosen by the client: a retry with the same id is not taken twice "
                    "(the answer names the message already on the log)"
                ),
            },
        },
    },
    "Posted": {
        "type": "object",
        "required": ["session_id", "message_id", "version", "position", "partition"],
        "properties": {
            "session_id": {
                "type": "string",
                "description": "the session the message went to: the path's, or its successor's",
            },
            "continued_from": {
                "type": "string",
                "description": (
                    "present when the path's session had expired and its agent continues in a new "
                    "session: the expired one (send later messages and read events at session_id)"
                ),
            },
            "message_id": {"type": "string"},
            "version": {"type": "integer"},
            "position": POSITION,
            "partition": {"type": ["integer", "null"]},
        },
    },
    "Finish": {
        "type": "object",
        "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 500, "pattern": NO_NUL}},
    },
    "Cancel": {
        "type": "object",
        "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 500, "pattern": NO_NUL}},
    },
    "Decision": {
        "description": "approve or reject as asked, or edit: run the call with new `arguments`",
        "oneOf": [
            {
                "type": "object",
                "required": ["decision"],
                "properties": {"decision": {"type": "string", "enum": ["approve", "reject"]}, "note": NOTE},
                "not": {"required": ["arguments"]},
            },
            {
                "type": "object",
                "required": ["decision", "arguments"],
                "properties": {
                    "decision": {"type": "string", "const": "edit"},
                    "arguments": {"type": "object", "description": "validated against the tool's schema"},
                    "note": NOTE,
                },
            },
        ],
    },
    "BudgetDecision": {
        "description": "raise the paused turn's allowance by `extra_micros`, or stop the turn",
        "oneOf": [
            {
                "type": "object",
                "required": ["decision", "extra_micros"],
                "properties": {
                    "decision": {"type": "string", "const": "raise"},
                    "extra_micros": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 10**15,
                        "description": "micro-dollars more",
                    },
                    "note": NOTE,
                },
            },
            {
                "type": "object",
                "required": ["decision"],
                "properties": {"decision": {"type": "string", "const": "stop"}, "note": NOTE},
            },
        ],
    },
    "AppendedEvent": {
        "type": "object",
        "required": ["type", "session_id", "version", "position", "partition"],
        "properties": {
            "type": {"type": "string"},
            "session_id": {"type": "string"},
            "version": {"type": "integer"},
            "position": POSITION,
            "partition": {"type": ["integer", "null"]},
        },
        "description": "an event appended by the request: its fields, its type and its log position",
    },
    "Appended": {
        "type": "object",
        "required": ["events"],
        "properties": {"events": {"type": "array", "items": ref("AppendedEvent")}},
    },
    "Cancelled": {
        "type": "object",
        "required": ["stopped_turn", "dropped", "events"],
        "properties": {
            "stopped_turn": STOPPED_TURN,
            "dropped": DROPPED,
            "events": {"type": "array", "items": ref("AppendedEvent")},
        },
    },
    "Interrupted": {
        "type": "object",
        "required": ["interrupted", "stopped_turn", "dropped", "events"],
        "properties": {
            "interrupted": {"type": "boolean", "description": "a running turn was asked to stop"},
            "stopped_turn": STOPPED_TURN,
            "dropped": DROPPED,
            "events": {"type": "array", "items": ref("AppendedEvent")},
        },
    },
    "ExperimentStart": {
        "type": "object",
        "required": ["agent"],
        "properties": {
            "agent": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_NUL},
            "select": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "agent": {"type": "string"},
                    "user": {"type": "string"},
                    "since_ms": {"type": "integer"},
                    "until_ms": {"type": "integer"},
                    "session_ids": {"type": "array", "items": {"type": "string"}},
                    "sample": {"type": "integer", "minimum": 1},
                    "seed": {"type": "integer"},
                },
            },
            "from_turn": {
                "type": "integer",
                "minimum": 0,
                "description": "0: replay from the start; N: fork each session where its turn N ended. "
                "Past the turns a selected session has ended: 422 naming the valid range.",
            },
            "live": {"oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "string"}}]},
            "concurrency": {"type": "integer", "minimum": 1, "maximum": 64},
            "name": {"type": "string", "maxLength": 200},
        },
    },
    "ExperimentStarted": {
        "type": "object",
        "required": ["experiment_id", "sessions", "running", "status", "error"],
        "properties": {
            "experiment_id": {"type": "string"},
            "name": {"type": "string"},
            "candidate": {"type": "string"},
            "agent_id": {"type": ["string", "null"]},
            "sessions": {"type": "integer"},
            "from_turn": {"type": "integer"},
            "created_ms": {"type": "integer"},
            "actor": {"type": "string"},
            "running": {"type": "boolean"},
            "status": {
                "type": "string",
                "enum": ["running", "finished", "failed", "not_running"],
                "description": "this gateway's run of it: failed when the run ended in an error or some "
                "sessions could not be replayed (`error` says why); not_running: not run here since start",
            },
            "error": {"type": "string"},
            "report": {"type": "string"},
        },
    },
    "ExperimentList": {
        "type": "object",
        "required": ["experiments"],
        "properties": {"experiments": {"type": "array", "items": ref("ExperimentStarted")}},
    },
    "ExperimentReport": {
        "type": "object",
        "required": ["experiment_id", "spec", "summary", "sessions", "running", "status", "error"],
        "properties": {
            "experiment_id": {"type": "string"},
            "spec": {"type": "object"},
            "running": {"type": "boolean"},
            "status": {"type": "string", "enum": ["running", "finished", "failed", "not_running"]},
            "error": {"type": "string"},
            "summary": {
                "type": "object",
                "description": "counts over every session and turn, token/cost/latency deltas",
            },
            "sessions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["origin_session_id", "replay_session_id", "divergent", "turn_diffs"],
                    "properties": {
                        "origin_session_id": {"type": "string"},
                        "replay_session_id": {"type": "string"},
                        "divergent": {"type": "boolean"},
                        "complete": {"type": "boolean"},
                        "error": {"type": "string"},
                        "turn_diffs": {"type": "array", "items": {"type": "object"}},
                    },
                },
            },
        },
    },
    "Fork": {
        "type": "object",
        "required": ["version"],
        "properties": {
            "version": {"type": "integer", "minimum": 1, "description": "a snapshot's version"},
            "agent": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_NUL},
            "unfinished": {
                "type": "string",
                "enum": ["continue", "rest"],
                "description": "required for a snapshot with a turn running or messages waiting: carry "
                "them on now (a call the origin started is never repeated) or close the turn and wait",
            },
        },
    },
    "Forked": {
        "allOf": [
            ref("AppendedEvent"),
            {
                "type": "object",
                "required": ["origin_session_id", "origin_version", "agent_id", "user_id", "status"],
                "properties": {
                    "origin_session_id": {"type": "string"},
                    "origin_version": {"type": "integer"},
                    "agent_id": {"type": "string"},
                    "model": {"type": "string"},
                    "user_id": {"type": "string"},
                    "status": {"type": "string"},
                    "turn_running": {"type": "boolean"},
                    "events": {"type": "array", "items": ref("AppendedEvent")},
                },
            },
        ]
    },
    "SnapshotList": {
        "type": "object",
        "required": ["session_id", "snapshots"],
        "properties": {
            "session_id": {"type": "string"},
            "snapshots": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["version", "status", "turns", "message_count", "time_ms"],
                    "properties": {
                        "version": {"type": "integer"},
                        "status": {"type": "string"},
                        "last_tool": {"type": "string"},
                        "turns": {"type": "integer"},
                        "input_tokens": {"type": "integer"},
                        "output_tokens": {"type": "integer"},
                        "message_count": {"type": "integer"},
                        "time_ms": {"type": "integer"},
                        "turn_id": {"type": ["string", "null"]},
                    },
                },
            },
        },
    },
    "Replay": {
        "type": "object",
        "required": ["session_id", "steps", "next_after_version"],
        "properties": {
            "session_id": {"type": "string"},
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["event", "state"],
                    "properties": {
                        "event": {"type": "object", "description": "the event's fields and type"},
                        "state": {
                            "type": "object",
                            "required": ["version", "status"],
                            "properties": {"version": {"type": "integer"}, "status": {"type": "string"}},
                            "description": "the session folded up to and including the event",
                        },
                    },
                },
            },
            "next_after_version": {
                "type": ["integer", "null"],
                "description": "pass as after_version for the next page; null on the last page",
            },
        },
    },
    "Session": {
        "type": "object",
        "required": ["session_id", "user_id", "agent_id", "role", "current_state", "state_version", "closed"],
        "properties": {
            "session_id": {"type": "string"},
            "user_id": {"type": "string"},
            "agent_id": {"type": "string"},
            "role": {"type": "string"},
            "model_name": {"type": "string"},
            "current_state": {"type": "string"},
            "state_version": {"type": "integer"},
            "message_count": {"type": "integer"},
            "turns": {"type": "integer"},
            "input_tokens": {"type": "integer"},
            "output_tokens": {"type": "integer"},
            "cost_micros": {"type": "integer", "description": "micro-dollars spent (0 when unpriced)"},
            "priced": {
                "type": "boolean",
                "description": "whether the agent's price table prices the session's model; when it does "
                "not, a cost of 0 means unknown",
            },
            "closed": {"type": "boolean"},
            "close_reason": {
                "type": "string",
                "description": "`expired`: closed after a time without activity",
            },
            "start_time_ms": {"type": "integer"},
            "update_time_ms": {"type": "integer", "description": "its last event's time"},
            "closed_at_ms": {"type": ["integer", "null"], "description": "when it was closed"},
            "turn_running": {
                "type": "boolean",
                "description": "GET of one session only: it can be cancelled",
            },
            "pending_approvals": {
                "type": "array",
                "description": "GET of one session only: tool calls waiting for a decision",
                "items": {
                    "type": "object",
                    "required": ["call_id", "tool_name", "arguments"],
                    "properties": {
                        "call_id": {"type": "string"},
                        "tool_name": {"type": "string"},
                        "arguments": {},
                        "iteration": {"type": "integer"},
                    },
                },
            },
        },
    },
    "SessionList": {
        "type": "object",
        "properties": {"sessions": {"type": "array", "items": ref("Session")}},
    },
    "Timeline": {
        "type": "object",
        "required": [
            "session",
            "messages",
            "turns",
            "model_calls",
            "tool_calls",
            "state_changes",
            "events",
            "position",
        ],
        "properties": {
            "session": ref("Session"),
            **{
                name: {"type": "array", "items": {"type": "object"}}
                for name in ("messages", "turns", "model_calls", "tool_calls", "state_changes")
            },
            "position": {
                "type": "integer",
                "description": "log position of the session's last event: follow the event stream from it "
                "with ?after=",
            },
            "events": {
                "type": "array",
                "items": {"type": "object", "required": ["type", "version"]},
                "description": "every event of a kind the other lists do not show (approvals, guard stops, "
                "fallbacks, snapshots, cancels, forks, context and memory events...), with its fields",
            },
        },
    },
    "History": {
        "type": "object",
        "properties": {
            "session": ref("Session"),
            "messages": {"type": "array", "items": {"type": "object"}},
        },
    },
    "Erasure": {
        "type": "object",
        "required": ["erasure_id", "scope", "subject", "state", "sessions", "erased_now", "unerasable"],
        "properties": {
            "erasure_id": {"type": "string"},
            "scope": {"type": "string", "enum": ["user", "session"]},
            "subject": {"type": "string", "description": "the user id or the session id"},
            "state": {"type": "string", "enum": ["done"]},
            "sessions": {"type": "integer", "description": "sessions the erasure covers"},
            "erased_now": {"type": "integer", "description": "of them, erased by this call (0: done before)"},
            "unerasable": {
                "type": "array",
                "items": {"type": "string"},
                "description": "sessions written before encryption: their log records keep plaintext",
            },
        },
    },
}
