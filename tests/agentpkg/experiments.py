"""Candidate agents for the experiment tests (tests/test_experiments.py), loaded like --agents
(``--candidate tests.agentpkg.experiments:<name>``): the logistics demo agent on a fixed day with

* ``same``: the recorded scripted model, unchanged;
* ``skips_notice``: a scripted model that leaves out the first apology notice of each task;
* ``other_message``: a scripted model that sends every notice with another text (a write tool
  called with other arguments: the experiment must never run it);
* ``loops``: a model that asks for the same query again and again (a loop guard ends its turns);
* ``wider_query``: a scripted model that queries from one day earlier (a read-only tool called
  with other arguments: run live only when the experiment allows it);
* ``hangs``: the recorded model until TURNLOG_EXPERIMENT_HANG_AFTER model calls were made in this
  process; then it writes the file TURNLOG_EXPERIMENT_HANG_FILE and never answers (the test
  kills the process there).

``BACKEND`` is the candidates' business system: its outbox shows whether a notice was really sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import os
from pathlib import Path
from typing import AsyncIterator, Callable

from turnlog.engine import AgentDirectory, FunctionModel, ModelRequest, ModelResponse, call, reply
from turnlog.engine.models.base import Model, ModelChunk
from turnlog.examples.logistics import LogisticsBackend, build_agent, demo_model

TODAY = dt.date(2026, 11, 30)
BACKEND = LogisticsBackend(
    today=TODAY, reports_dir=Path(os.environ.get("TMPDIR", "/tmp")) / "experiment-reports"
)


def recorded_model() -> FunctionModel:
    return demo_model(TODAY, chunk_chars=0)


def _agents(model: Model) -> AgentDirectory:
    return AgentDirectory([build_agent(model, BACKEND)])


def _changed(change: Callable[[ModelResponse], ModelResponse], name: str) -> FunctionModel:
    decide = recorded_model().fn
    return FunctionModel(lambda request: change(_response(decide(request))), name=name)


def _response(answer: ModelResponse | str) -> ModelResponse:
    return answer if isinstance(answer, ModelResponse) else ModelResponse(text=answer)


def _skip_first_notice(response: ModelResponse) -> ModelResponse:
    calls = response.tool_calls
    if len(calls) > 1 and all(c.name == "send_notification" for c in calls):
        return dataclasses.replace(response, tool_calls=calls[1:])
    return response


def _other_message(response: ModelResponse) -> ModelResponse:
    calls = tuple(
        dataclasses.replace(c, arguments_json=c.arguments_json.replace("We are sorry", "Apologies"))
        if c.name == "send_notification"
        else c
        for c in response.tool_calls
    )
    return dataclasses.replace(response, tool_calls=calls)


def _wider_query(response: ModelResponse) -> ModelResponse:
    def widened(arguments_json: str) -> str:
        arguments = json.loads(arguments_json)
        start = dt.date.fromisoformat(arguments["start_date"])  # the valid call (ISO dates)
        return json.dumps({**arguments, "start_date": (start - dt.timedelta(days=1)).isoformat()})

    calls = tuple(
        dataclasses.replace(c, arguments_json=widened(c.arguments_json))
        if c.name == "query_orders" and "-" in c.arguments_json
        else c
        for c in response.tool_calls
    )
    return dataclasses.replace(response, tool_calls=calls)


def same() -> AgentDirectory:
    return _agents(recorded_model())


def skips_notice() -> AgentDirectory:
    return _agents(_changed(_skip_first_notice, "scripted-skips-notice"))


def other_message() -> AgentDirectory:
    return _agents(_changed(_other_message, "scripted-other-message"))


def loops() -> AgentDirectory:
    query = {"start_date": "2026-11-23", "end_date": "2026-11-29", "anomalies_only": True}
    return _agents(FunctionModel(lambda request: reply("", call("query_orders", query)), name="loops"))


def wider_query() -> AgentDirectory:
    return _agents(_changed(_wider_query, "scripted-wider-query"))


class HangingModel(Model):
    """The recorded model, until it has answered ``after`` calls: then it never answers again."""

    def __init__(self, after: int, marker: Path) -> None:
        self.inner = recorded_model()
        self.name = self.inner.name
        self.after = after
        self.marker = marker
        self.answered = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        if self.answered >= self.after:
            self.marker.write_text(str(self.answered))
            await asyncio.Event().wait()  # killed here
        self.answered += 1
        async for chunk in self.inner.stream(request):
            yield chunk


def hangs() -> AgentDirectory:
    after = int(os.environ["TURNLOG_EXPERIMENT_HANG_AFTER"])
    model = HangingModel(after, Path(os.environ["TURNLOG_EXPERIMENT_HANG_FILE"]))
    agent = dataclasses.replace(
        build_agent(model, BACKEND), first_token_timeout_s=600.0, model_timeout_s=600.0
    )
    return AgentDirectory([agent])
