"""Run an experiment: replay each selected session's user messages, turn by turn, in a new session
run by a candidate agent whose tools are served from the recording, many sessions at once.

The experiment's definition is the first event of its manifest session (a ``SessionCreated`` of
agent ``turnlog.experiment`` whose ``metadata_json`` holds the spec); each replay is a session with
an id derived from the experiment and its origin (``namespace.replay_id``). So the log holds the
experiment's progress: a run that was killed is resumed by reading the spec back and, per origin,
the replay's events: a replay with every planned turn finished is left alone, one with a turn
running is carried on (the engine's recovery: the model call made again, a call of a tool that is
not idempotent never repeated), and the messages not yet posted are posted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import events as ev
from ..admin import SessionAdmin
from ..agent import AgentDirectory
from ..errors import ConfigurationError, ExperimentNotFoundError, InputError, TurnlogError
from ..log.base import EventLog
from ..session import AgentSessions
from ..states import SessionStatus
from .compare import ExperimentReport, SessionDiff, compare_session
from .namespace import MANIFEST_AGENT, manifest_id, replay_id
from .recording import RecordedTurn, Recording, load_recording, recording_of
from .selection import SCAN_PAGE, Selection, select_sessions
from .tool_server import RecordedTools, ReplayCursor, reset_cursor, set_cursor

DEFAULT_CONCURRENCY = 8
MANIFEST_WAIT_S = 30.0
ENDED = (SessionStatus.FINISHED, SessionStatus.ERROR, SessionStatus.CANCELLED, SessionStatus.IDLE)


@dataclass
class ExperimentSpec:
    """What an experiment replays and against what (stored on its manifest)."""

    experiment_id: str
    sessions: list[str]
    """The recorded sessions, in the order selected."""
    candidate: str
    """Where the candidate agents come from (``package.module:attr``, or a name given in Python)."""
    agent_id: str | None = None
    """The candidate agent; None: the agent of the same id as each recorded session's."""
    from_turn: int = 0
    """0: replay from the start; N: fork each session at the snapshot taken when its N-th turn
    ended and replay the turns after it."""
    from_version: int | None = None
    """Fork at exactly this snapshot version (one session only)."""
    live: list[str] | bool = field(default_factory=list)
    """Idempotent tools that may run live when the recording has no match (True: all)."""
    concurrency: int = DEFAULT_CONCURRENCY
    selection: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    actor: str = "admin"
    created_ms: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @staticmethod
    def from_json(text: str) -> ExperimentSpec:
        return ExperimentSpec(**json.loads(text))


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    origin_session_id: str
    replay_session_id: str
    skipped: bool
    """Already finished by an earlier run (resume): nothing was replayed."""


def new_experiment_id() -> str:
    return ev.new_id()[:12]


async def load_spec(log: EventLog, experiment_id: str) -> ExperimentSpec:
    events = await log.read_session(manifest_id(experiment_id), 0)
    head = events[0] if events else None
    if not isinstance(head, ev.SessionCreated) or head.agent_id != MANIFEST_AGENT:
        raise ExperimentNotFoundError(experiment_id)
    return ExperimentSpec.from_json(json.loads(head.metadata_json)["experiment"])


async def list_experiments(log: EventLog) -> list[ExperimentSpec]:
    """Every experiment on the log, oldest first (a scan of the log's session heads)."""
    specs: list[ExperimentSpec] = []
    for partition in range(log.partitions):
        offset = 0
        while records := await log.read_partition(partition, offset, SCAN_PAGE):
            for r in records:
                e = r.event
                if isinstance(e, ev.SessionCreated) and e.version == 1 and e.agent_id == MANIFEST_AGENT:
                    specs.append(ExperimentSpec.from_json(json.loads(e.metadata_json)["experiment"]))
            offset = records[-1].offset + 1
    return sorted(specs, key=lambda s: (s.created_ms, s.experiment_id))


class ExperimentRunner:
    """Defines, runs, resumes and reports experiments on ``log`` with the ``candidates`` agents."""

    def __init__(
        self,
        log: EventLog,
        candidates: AgentDirectory | None = None,
        *,
        producer: str = "experiment",
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.log = log
        self.candidates = candidates
        self.producer = producer
        self.on_progress = on_progress
        self.errors: dict[str, str] = {}

    async def define(
        self,
        selection: Selection,
        *,
        candidate: str,
        agent_id: str | None = None,
        from_turn: int = 0,
        from_version: int | None = None,
        live: Collection[str] | bool = (),
        concurrency: int = DEFAULT_CONCURRENCY,
        name: str = "",
        actor: str = "admin",
        experiment_id: str | None = None,
    ) -> ExperimentSpec:
        """Select the sessions and write the experiment's manifest; nothing is replayed yet."""
        if concurrency < 1:
            raise InputError("concurrency must be at least 1")
        sessions = await select_sessions(self.log, selection)
        if from_version is not None and len(sessions) != 1:
            raise InputError("from_version names a snapshot of one session; select exactly one session")
        if from_version is None:
            await self._check_from_turn(sessions, from_turn)
        spec = ExperimentSpec(
            experiment_id=experiment_id or new_experiment_id(),
            sessions=sessions,
            candidate=candidate,
            agent_id=agent_id,
            from_turn=from_turn,
            from_version=from_version,
            live=live if isinstance(live, bool) else sorted(live),
            concurrency=concurrency,
            selection=selection.describe(),
            name=name,
            actor=actor,
            created_ms=int(time.time() * 1000),
        )
        manifest = ev.SessionCreated(
            session_id=manifest_id(spec.experiment_id),
            version=1,
            agent_id=MANIFEST_AGENT,
            user_id=actor,
            role="admin",
            model="",
            metadata_json=json.dumps({"experiment": spec.to_json()}),
            producer=self.producer,
        )
        submitted = await self.log.submit(manifest)
        await self.log.sequenced(submitted[0], MANIFEST_WAIT_S)
        return spec

    async def _check_from_turn(self, sessions: list[str], from_turn: int) -> None:
        """Refuse a ``from_turn`` some selected session cannot fork at (past the turns it has
        ended, or negative) before anything is written, saying the range every session has."""
        if from_turn == 0:
            return
        ended = {sid: max(await self._turn_ends(sid), default=0) for sid in sessions}
        shortest = min(ended, key=lambda sid: ended[sid])
        if not 0 <= from_turn <= ended[shortest]:
            raise InputError(
                f"from_turn must be in 0..{ended[shortest]} (0: from the start; N: from the end of each "
                f"session's turn N), not {from_turn}: session {shortest} has ended {ended[shortest]} turns"
            )

    async def _turn_ends(self, session_id: str) -> dict[int, int]:
        """Turn number → the version of the last snapshot taken when that turn had ended."""
        snapshots = await SessionAdmin(self.log).snapshots(session_id)
        return {s.turns: s.version for s in snapshots if s.status in ENDED}

    async def run(self, spec: ExperimentSpec) -> ExperimentReport:
        """Replay every session of ``spec`` not replayed yet (``spec.concurrency`` at once), then
        report. Running it again (``resume``) repeats nothing that finished."""
        await self.replay(spec)
        return await self.report(spec)

    async def replay(self, spec: ExperimentSpec) -> None:
        """``run`` without the report."""
        api = AgentSessions(self.log, self._replay_agents(spec), producer=self.producer)
        gate = asyncio.Semaphore(spec.concurrency)
        done = 0

        async def one(origin: str) -> None:
            nonlocal done
            async with gate:
                skipped = await self._replay(api, spec, origin)
            done += 1
            if self.on_progress is not None:
                self.on_progress(
                    Progress(done, len(spec.sessions), origin, replay_id(spec.experiment_id, origin), skipped)
                )

        await asyncio.gather(*(one(origin) for origin in spec.sessions))

    async def resume(self, experiment_id: str) -> ExperimentReport:
        return await self.run(await load_spec(self.log, experiment_id))

    async def report(self, spec: ExperimentSpec) -> ExperimentReport:
        """The comparison of every origin with its replay, from the log (no agents needed)."""
        diffs: list[SessionDiff] = []
        for origin in spec.sessions:
            recording = await load_recording(self.log, origin)
            planned = await self._planned(spec, recording)
            rid = replay_id(spec.experiment_id, origin)
            events = await self.log.read_session(rid)
            replay = recording_of(rid, events) if events else None
            error = self.errors.get(origin, "" if replay is not None else "not replayed yet")
            diffs.append(compare_session(recording, planned, replay, error))
        return ExperimentReport(spec.experiment_id, json.loads(spec.to_json()), diffs)

    def _replay_agents(self, spec: ExperimentSpec) -> AgentDirectory:
        if self.candidates is None:
            raise ConfigurationError("an experiment runs with candidate agents; give ExperimentRunner some")
        server = RecordedTools(spec.live)
        return AgentDirectory(server.wrap(a) for a in self.candidates)

    async def _planned(self, spec: ExperimentSpec, recording: Recording) -> list[RecordedTurn]:
        return recording.turns_after(await self._fork_version(spec, recording))

    async def _fork_version(self, spec: ExperimentSpec, recording: Recording) -> int:
        """The snapshot version a replay starts from (0: the start)."""
        if spec.from_version is not None:
            return spec.from_version
        if spec.from_turn == 0:
            return 0
        found = (await self._turn_ends(recording.session_id)).get(spec.from_turn)
        if found is None:
            raise InputError(
                f"session {recording.session_id} has no snapshot at the end of turn {spec.from_turn} "
                f"(it has {len(recording.turns)} turns); choose a smaller --from-turn"
            )
        return found

    async def _replay(self, api: AgentSessions, spec: ExperimentSpec, origin: str) -> bool:
        """Replay ``origin`` (or what is left of it); True if it was already complete."""
        try:
            recording = await load_recording(self.log, origin)
            fork_at = await self._fork_version(spec, recording)
            planned = recording.turns_after(fork_at)
            rid = replay_id(spec.experiment_id, origin)
            if await self.log.session_version(rid) == 0:
                await self._open(api, spec, recording, rid, fork_at)
            return await self._post_turns(api, recording, planned, rid)
        except TurnlogError as exc:  # this session's replay failed; the others go on
            self.errors[origin] = f"{type(exc).__name__}: {exc}"
            return False

    async def _open(
        self, api: AgentSessions, spec: ExperimentSpec, recording: Recording, rid: str, fork_at: int
    ) -> None:
        agent_id = spec.agent_id or recording.agent_id
        if agent_id not in api.agents:
            known = ", ".join(a.agent_id for a in api.agents)
            raise ConfigurationError(
                f"the candidate agents have no agent {agent_id!r} (session {recording.session_id} ran it); "
                f"they have {known}: name one with agent_id / --agent"
            )
        if fork_at:
            model = api.agents.get(agent_id).model.name
            forked = await SessionAdmin(self.log, producer=self.producer).fork_events(
                recording.session_id,
                fork_at,
                new_session_id=rid,
                agent_id=agent_id,
                model=model,
                unfinished="rest",
            )
            await api.on_log(forked[0], "the replay")
            return
        await api.create_session(
            agent_id,
            recording.user_id or spec.actor,
            role=recording.role or "user",
            session_id=rid,
            metadata={"experiment": spec.experiment_id, "origin_session_id": recording.session_id},
        )

    async def _post_turns(
        self, api: AgentSessions, recording: Recording, planned: list[RecordedTurn], rid: str
    ) -> bool:
        posted = sum(1 for e in await self.log.read_session(rid) if isinstance(e, ev.UserMessageReceived))
        state = await api.get_state(rid)
        unfinished = state.turn is not None or bool(state.inbox)
        if posted >= len(planned) and not unfinished:
            return True
        view = Recording(**{**recording.__dict__, "turns": planned})
        cursor = ReplayCursor(view, max(0, posted - 1))
        token = set_cursor(cursor)
        try:
            if unfinished:  # a killed run left a turn running: the engine's recovery carries it on
                async for _ in api.run_pending(rid):
                    pass
            for index in range(posted, len(planned)):
                state = await api.get_state(rid)
                if state.closed or state.status == SessionStatus.PAUSED_FOR_USER:
                    raise InputError(
                        f"replay {rid} stopped at turn {index}: the session is {state.status} "
                        "(approvals are not replayed)"
                    )
                cursor.turn_index = index
                async for _ in api.send_user_message(rid, planned[index].text):
                    pass
        finally:
            reset_cursor(token)
        return False
