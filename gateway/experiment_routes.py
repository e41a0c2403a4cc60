"""Admin routes for experiments (engine.experiments): start one against an agent this gateway
serves, resume it, list them, read a report. The admin role only, like the other admin routes.

An experiment runs in this process, in the background (the POST answers 202 with its id at
once): its replays are turns this process runs, so the gateway needs the embedded log or, on
Kafka, to own the partitions (a gateway started with a worker). The report is made from the log
on every GET, so it shows the progress of a running experiment and survives a restart (resume
it with POST .../resume, or `turnlog experiment resume`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from turnlog.engine.agent import AgentDirectory
from turnlog.engine.experiments import (
    ExperimentRunner,
    ExperimentSpec,
    Selection,
    list_experiments,
    load_spec,
)
from turnlog.engine.experiments.report import report_json

from .bodies import json_body
from .http import HttpError, int_field, principal_of, string_field
from .parts import GatewayParts

log = structlog.get_logger("turnlog.gateway")
MAX_CONCURRENCY = 64
ANY = 10**40
"""Bounds wide enough for any number the body may hold (``from_turn`` is checked by the runner,
which knows the range the selected sessions have)."""
SELECT_FIELDS = {"agent", "user", "since_ms", "until_ms", "session_ids", "sample", "seed"}


@dataclass
class Run:
    """An experiment run in this process: running, or how it ended."""

    runner: ExperimentRunner
    done: bool = False
    error: str = ""
    """Why it failed: the error that ended it, or the sessions whose replay failed ("" if none)."""

    def status(self) -> dict[str, Any]:
        state = "running" if not self.done else "failed" if self.error else "finished"
        return {"running": not self.done, "status": state, "error": self.error}


NOT_RUN_HERE = {"running": False, "status": "not_running", "error": ""}
"""An experiment this gateway has not run since it started (another process ran it, or it ran
before a restart): its report, read from the log, shows how far it got."""


class ExperimentRoutes:
    def __init__(self, gw: GatewayParts) -> None:
        self.gw = gw
        self.runs: dict[str, Run] = {}

    async def list(self, request: Request) -> Response:
        specs = await list_experiments(self.gw.log)
        return JSONResponse({"experiments": [{**_spec_json(s), **self._status(s)} for s in specs]})

    def _status(self, spec: ExperimentSpec) -> dict[str, Any]:
        run = self.runs.get(spec.experiment_id)
        return run.status() if run is not None else NOT_RUN_HERE

    async def start(self, request: Request) -> Response:
        """Body: ``agent`` (the candidate, an agent of this gateway), ``select`` (agent, user,
        since_ms, until_ms, session_ids, sample, seed), ``from_turn``, ``live`` (tool names or
        true), ``concurrency``, ``name``."""
        body = await json_body(request, self.gw.limits)
        agent_id = self._candidate(body)
        runner = ExperimentRunner(self.gw.log, AgentDirectory([self.gw.api.agents.get(agent_id)]))
        spec = await runner.define(
            _selection(body.get("select") or {}),
            candidate=f"gateway agent {agent_id}",
            agent_id=agent_id,
            from_turn=int_field(body, "from_turn", low=-ANY, high=ANY) if "from_turn" in body else 0,
            live=_live(body.get("live", [])),
            concurrency=int_field(body, "concurrency", low=1, high=MAX_CONCURRENCY)
            if "concurrency" in body
            else 8,
            name=str(body.get("name") or "")[:200],
            actor=principal_of(request).user,
        )
        self._launch(runner, spec)
        return JSONResponse(
            {
                **_spec_json(spec),
                **self._status(spec),
                "report": f"/v1/admin/experiments/{spec.experiment_id}",
            },
            202,
        )

    async def resume(self, request: Request) -> Response:
        spec = await load_spec(self.gw.log, request.path_params["experiment_id"])
        if not self._status(spec)["running"]:
            agent_id = spec.agent_id or ""
            if agent_id not in self.gw.api.agents:
                raise HttpError(
                    409,
                    "unknown_agent",
                    f"this gateway has no agent {agent_id!r} to resume the experiment with",
                )
            self._launch(
                ExperimentRunner(self.gw.log, AgentDirectory([self.gw.api.agents.get(agent_id)])), spec
            )
        return JSONResponse({**_spec_json(spec), **self._status(spec)}, 202)

    async def report(self, request: Request) -> Response:
        spec = await load_spec(self.gw.log, request.path_params["experiment_id"])
        all_turns = request.query_params.get("all_turns") in ("1", "true")
        run = self.runs.get(spec.experiment_id)  # its runner knows why a session's replay failed
        report = await (run.runner if run is not None else ExperimentRunner(self.gw.log)).report(spec)
        return JSONResponse({**report_json(report, all_turns=all_turns), **self._status(spec)})

    def _candidate(self, body: dict[str, Any]) -> str:
        agent_id = string_field(body, "agent")
        if agent_id not in self.gw.api.agents:
            known = ", ".join(sorted(a.agent_id for a in self.gw.api.agents)) or "none"
            raise HttpError(422, "unknown_agent", f"no agent {agent_id!r}; known agents: {known}")
        return agent_id

    def _launch(self, runner: ExperimentRunner, spec: ExperimentSpec) -> None:
        run = self.runs[spec.experiment_id] = Run(runner)

        async def replay() -> None:
            try:
                await runner.replay(spec)
                run.error = _failed_sessions(runner.errors, len(spec.sessions))
            except asyncio.CancelledError:
                run.error = "stopped with the gateway before it ended; resume it"
                raise
            except Exception as exc:  # the report shows what was replayed; resume carries on
                run.error = f"{type(exc).__name__}: {exc}"
            finally:
                run.done = True
                if run.error:
                    log.error("experiment.failed", experiment=spec.experiment_id, error=run.error)

        self.gw.background(replay())


def _failed_sessions(errors: dict[str, str], sessions: int) -> str:
    """Why some sessions' replays failed, in a line ("" if none did)."""
    if not errors:
        return ""
    origin, error = next(iter(errors.items()))
    return f"{len(errors)} of {sessions} sessions could not be replayed; session {origin}: {error}"


def _selection(raw: Any) -> Selection:
    if not isinstance(raw, dict) or set(raw) - SELECT_FIELDS:
        raise HttpError(
            422, "invalid_input", f"'select' is an object with some of: {', '.join(sorted(SELECT_FIELDS))}"
        )
    ids = raw.get("session_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise HttpError(422, "invalid_input", "'select.session_ids' is a list of session ids")
    numbers = {k: raw.get(k) for k in ("since_ms", "until_ms", "sample", "seed")}
    if any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in numbers.values()):
        raise HttpError(422, "invalid_input", "'select' times, sample and seed are integers")
    texts = {k: raw.get(k) for k in ("agent", "user")}
    if any(v is not None and not isinstance(v, str) for v in texts.values()):
        raise HttpError(422, "invalid_input", "'select.agent' and 'select.user' are strings")
    return Selection(
        texts["agent"], texts["user"], numbers["since_ms"], numbers["until_ms"], tuple(ids),
        numbers["sample"], numbers["seed"] or 0,
    )  # fmt: skip


def _live(raw: Any) -> list[str] | bool:
    if raw is True or raw is False:
        return raw
    if isinstance(raw, list) and all(isinstance(n, str) for n in raw):
        return raw
    raise HttpError(422, "invalid_input", "'live' is true, false or a list of tool names")


def _spec_json(spec: ExperimentSpec) -> dict[str, Any]:
    return {
        "experiment_id": spec.experiment_id,
        "name": spec.name,
        "candidate": spec.candidate,
        "agent_id": spec.agent_id,
        "sessions": len(spec.sessions),
        "from_turn": spec.from_turn,
        "created_ms": spec.created_ms,
        "actor": spec.actor,
    }
