"""AG-UI 1.0: ``POST /v1/agui/{agent}`` takes a RunAgentInput and streams the run as AG-UI events,
mapped from turnlog's own events (the ``ag-ui-protocol`` package has the types and the encoder).

A thread is a session of the caller's: its session id is a hash of (user, threadId), so two users
with the same threadId get different sessions and nobody can learn that another user's thread
exists. The last user message of the input is posted to the log; the run is that message's turn
(in the thread session's successor when it expired and its agent continues in a new session,
engine.expiry: RUN_FINISHED's result names the session):

    TurnStarted          → RUN_STARTED, STATE_SNAPSHOT {session_id, status, version}
    StateChanged         → STATE_DELTA (JSON Patch on /status and /version)
    ModelCallStarted/Fin → STEP_STARTED / STEP_FINISHED "model_call_<step>"
    delta                → TEXT_MESSAGE_START (first), TEXT_MESSAGE_CONTENT
    AssistantMessage     → TEXT_MESSAGE_END (or START+CONTENT+END when nothing was streamed)
    ToolCallRequested    → TOOL_CALL_START, TOOL_CALL_ARGS, TOOL_CALL_END
    ToolCallFinished     → TOOL_CALL_RESULT
    TurnFinished         → RUN_FINISHED, or RUN_ERROR when the model failed
"""

from __future__ import annotations

import hashlib
from typing import Any, AsyncIterator

from ag_ui.core import (
    BaseEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from turnlog.engine import events as ev
from turnlog.engine.errors import SessionNotFoundError
from turnlog.engine.expiry import open_target
from turnlog.engine.stream import ModelDelta, ModelWaiting

from .bodies import json_body
from .http import HttpError, principal_of
from .lifetimes import Holdings
from .parts import GatewayParts
from .stream import SessionStream


def thread_session_id(user: str, thread_id: str) -> str:
    return hashlib.sha256(f"{user}\0{thread_id}".encode()).hexdigest()[:32]


def _user_text(run: RunAgentInput) -> str:
    for message in reversed(run.messages):
        if isinstance(message, UserMessage):
            content = message.content
            if isinstance(content, str):
                return content
            return "".join(str(getattr(part, "text", "")) for part in content)
    raise HttpError(422, "invalid_input", "the run's messages hold no user message to answer")


class RunMapper:
    """Turns one turn's log events and deltas into AG-UI events, in order."""

    def __init__(self, run: RunAgentInput, session_id: str) -> None:
        self.run = run
        self.session_id = session_id
        self.turn_id: str | None = None
        self.step = 0
        self.text_open: str | None = None
        self.done = False

    def _text_id(self) -> str:
        return f"{self.turn_id}-{self.step}"

    def on_event(self, event: ev.Event, message_id: str) -> list[BaseEvent]:
        if self.turn_id is None:
            if isinstance(event, ev.TurnStarted) and event.message_id == message_id:
                self.turn_id = event.turn_id
                return [
                    RunStartedEvent(thread_id=self.run.thread_id, run_id=self.run.run_id),
                    StateSnapshotEvent(
                        snapshot={
                            "session_id": self.session_id,
                            "status": "PROCESSING",
                            "version": event.version,
                        }
                    ),
                ]
            if isinstance(event, ev.UserMessageDropped) and event.message_id == message_id:
                self.done = True  # no turn will take it: the run ends with the log's reason
                return [
                    RunStartedEvent(thread_id=self.run.thread_id, run_id=self.run.run_id),
                    RunErrorEvent(message=event.detail or event.reason, code=f"message_{event.reason}"),
                ]
            return []
        handler = getattr(self, f"_{event.type}", None)
        return handler(event) if handler is not None else []

    def on_delta(self, delta: ModelDelta) -> list[BaseEvent]:
        if self.turn_id is None or delta.turn_id != self.turn_id or not delta.text:
            return []
        out: list[BaseEvent] = []
        if self.text_open is None:
            self.text_open = self._text_id()
            out.append(TextMessageStartEvent(message_id=self.text_open, role="assistant"))
        out.append(TextMessageContentEvent(message_id=self.text_open, delta=delta.text))
        return out

    def _StateChanged(self, event: ev.StateChanged) -> list[BaseEvent]:
        patch = [
            {"op": "replace", "path": "/status", "value": event.to_state},
            {"op": "replace", "path": "/version", "value": event.version},
        ]
        return [StateDeltaEvent.model_validate({"type": "STATE_DELTA", "delta": patch})]

    def _ModelCallStarted(self, event: ev.ModelCallStarted) -> list[BaseEvent]:
        self.step = event.step
        return [StepStartedEvent(step_name=f"model_call_{event.step}")]

    def _ModelCallFinished(self, event: ev.ModelCallFinished) -> list[BaseEvent]:
        return [StepFinishedEvent(step_name=f"model_call_{event.step}")]

    def _AssistantMessage(self, event: ev.AssistantMessage) -> list[BaseEvent]:
        if self.text_open is not None:
            message_id, self.text_open = self.text_open, None
            return [TextMessageEndEvent(message_id=message_id)]
        if not event.text:
            return []
        message_id = self._text_id()
        return [
            TextMessageStartEvent(message_id=message_id, role="assistant"),
            TextMessageContentEvent(message_id=message_id, delta=event.text),
            TextMessageEndEvent(message_id=message_id),
        ]

    def _ToolCallRequested(self, event: ev.ToolCallRequested) -> list[BaseEvent]:
        out: list[BaseEvent] = [
            ToolCallStartEvent(
                tool_call_id=event.call_id, tool_call_name=event.tool_name, parent_message_id=self._text_id()
            )
        ]
        if event.arguments_json:
            out.append(ToolCallArgsEvent(tool_call_id=event.call_id, delta=event.arguments_json))
        out.append(ToolCallEndEvent(tool_call_id=event.call_id))
        return out

    def _ToolCallFinished(self, event: ev.ToolCallFinished) -> list[BaseEvent]:
        return [
            ToolCallResultEvent(
                message_id=f"{event.call_id}-result",
                tool_call_id=event.call_id,
                content=event.content,
                role="tool",
            )
        ]

    def _TurnFinished(self, event: ev.TurnFinished) -> list[BaseEvent]:
        if event.turn_id != self.turn_id:
            return []
        self.done = True
        out: list[BaseEvent] = []
        if self.text_open is not None:
            out.append(TextMessageEndEvent(message_id=self.text_open))
            self.text_open = None
        if event.reason == "model_error":
            out.append(
                RunErrorEvent(message="the model call failed; see the session's events", code="model_error")
            )
        else:
            result: dict[str, Any] = {"reason": event.reason, "session_id": self.session_id}
            out.append(RunFinishedEvent(thread_id=self.run.thread_id, run_id=self.run.run_id, result=result))
        return out


class AguiRoute:
    def __init__(self, gw: GatewayParts) -> None:
        self.gw = gw

    async def run(self, request: Request) -> Response:
        principal = principal_of(request)
        agent_id = request.path_params["agent"]
        if agent_id not in self.gw.api.agents:
            raise HttpError(404, "not_found", f"no agent {agent_id!r}")
        try:
            run = RunAgentInput.model_validate(await json_body(request, self.gw.limits))
        except ValidationError as exc:
            raise HttpError(422, "invalid_input", f"not a RunAgentInput: {exc.errors()[0]['msg']}") from None
        text = _user_text(run)
        with Holdings() as held:  # the stream's slot first: a refused run creates nothing
            release = self.gw.streams.take(principal.user)
            if release is None:
                raise HttpError(429, "too_many_streams", "too many open streams; close one first")
            held.hold(release)
            session_id = await self._thread_session(agent_id, principal.user, run.thread_id)
            after = (await self.gw.log.read_session_records(session_id))[-1].offset
            stream = SessionStream(self.gw.log, self.gw.hub, session_id, after, poll_s=self.gw.config.poll_s)
            held.hold(stream.close)
            posted = (await self.gw.api.post_user_message(session_id, text)).event
            assert isinstance(posted, ev.UserMessageReceived)
            self.gw.hub.publish(posted)
            encoder = EventEncoder(accept=request.headers.get("accept", ""))
            body = _events(stream, RunMapper(run, session_id), posted.message_id, encoder)
            return held.answer(StreamingResponse(body, media_type=encoder.get_content_type()))

    async def _thread_session(self, agent_id: str, user: str, thread_id: str) -> str:
        """The session that carries the thread's next run: the thread's own, made on its first
        run, or for an expired thread its successor."""
        session_id = thread_session_id(user, thread_id)
        try:
            state = await self.gw.api.get_state(session_id)
        except SessionNotFoundError:
            await self.gw.api.create_session(agent_id, user, session_id=session_id)
            state = await self.gw.api.get_state(session_id)
        return (await open_target(self.gw.api, state)).session_id


async def _events(
    stream: SessionStream, mapper: RunMapper, message_id: str, encoder: EventEncoder
) -> AsyncIterator[str]:
    async for message in stream.items():
        if isinstance(message, ModelWaiting):
            continue  # AG-UI has no wait event; the run's events and deltas follow it
        if isinstance(message, ModelDelta):
            out = mapper.on_delta(message)
        else:
            out = mapper.on_event(message.event, message_id)
        for event in out:
            yield encoder.encode(event)
        if mapper.done:
            return
