"""The turn worker: runs the turns of user messages on its partitions, many sessions at once.

For each UserMessageReceived (or a decision, a CancelRequested, a SessionForked) it folds the session and lets
the TurnRunner do whatever the log says is left: a new turn, the rest of a turn a previous
worker died in, or stopping a turn someone cancelled. A redelivered message whose turn already
finished finds nothing to do, so no turn ever runs twice.

Sessions run concurrently (``KeyedConsumer``, keyed by session): up to ``max_concurrent_turns``
turns at once, each session's records strictly one at a time and in order. Turns mostly wait on
models, so thousands fit in one process. ``stop()`` lets each turn in flight finish the step it
is in and commit it; the rest of the turn stays on the log for the next worker.
"""

from __future__ import annotations

from typing import Callable, Sequence

import structlog

from turnlog.engine import events as ev
from turnlog.engine.admission import AdmissionRules, agent_prices
from turnlog.engine.agent import AgentDirectory
from turnlog.engine.experiments.namespace import is_experiment_session
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.models.endpoints import Endpoints
from turnlog.engine.session_cache import DEFAULT_CACHE_BYTES
from turnlog.engine.stream import StreamItem
from turnlog.engine.turn import Clock, TurnRunner

from .parallel import KeyedConsumer

GROUP = "turn-workers"
MAX_CONCURRENT_TURNS = 10_000
"""The default turn limit: turns mostly wait (on models, tools, people), and a waiting turn costs
a worker memory, not CPU (bench/README.md §12 measures how much); the model client's pool is
sized to match (engine.models.connections)."""
DRAIN_TIMEOUT_S = 30.0
"""How long ``stop()`` waits for the steps in flight (a model call may take longer: it is then
cancelled, and made again by the successor; a tool batch that ran past it is reported as
interrupted, or re-run if its tools are idempotent or keyed)."""
log = structlog.get_logger("turnlog.worker")


RESUMES = (ev.UserMessageReceived, ev.ApprovalDecided, ev.BudgetDecided, ev.CancelRequested, ev.SessionForked)
"""The events that give a worker something to do: a new message, a decision on a paused turn,
a cancel, a fork whose inherited turn or messages an admin chose to continue."""


def resumes(record: LogRecord) -> bool:
    return isinstance(record.event, RESUMES)


def load_tokenizers(agents: AgentDirectory) -> None:
    """Load each agent's tokenizer now, not in the first turn that counts: tiktoken's encoding
    takes about 0.1 s to load, on the event loop, and every turn of the first round after a
    start waited for it. (A local model's server tokenizer loads nothing here.)"""
    for agent in agents:
        agent.model.token_counter  # noqa: B018 (the property makes and caches the counter)


class TurnWorker:
    """Runs the turns of the sessions on its partitions: reads each user message, decision and
    cancel from the log and carries its session's turn on, many sessions at once."""

    def __init__(
        self,
        event_log: EventLog,
        agents: AgentDirectory,
        *,
        worker_id: str = "worker",
        partitions: Sequence[int] | None = None,
        on_item: Callable[[StreamItem], None] | None = None,
        max_concurrent_turns: int = MAX_CONCURRENT_TURNS,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        clock: Clock = ev.now_ms,
        endpoints: Endpoints | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        """``clock``: what a crashed tool call's starts are timed by (TurnRunner.clock);
        ``endpoints``: the process's model endpoints (TurnRunner.endpoints); ``cache_bytes``: what
        the worker keeps of idle sessions, by memory (engine.session_cache)."""
        self.runner = TurnRunner(
            event_log,
            agents.get,
            producer=worker_id,
            clock=clock,
            endpoints=endpoints,
            cache_bytes=cache_bytes,
        )
        event_log.admit_with(AdmissionRules(agent_prices(agents)))  # the owner admits submissions by them
        load_tokenizers(agents)
        self.on_item = on_item
        self.consumer = KeyedConsumer(
            event_log,
            GROUP,
            self.handle,
            wanted=self._wanted,
            partitions=partitions,
            max_in_flight=max_concurrent_turns,
            drain_timeout_s=drain_timeout_s,
            on_drain=self._drain,
        )

    def _wanted(self, record: LogRecord) -> bool:
        """Whether a record gives this worker work; a cancel (or an erasure, which closed the
        session in its commit) also stops its session's model call in flight at once (it is read
        while the turn's handler still runs: the session's records are handled in order), so the
        provider does not finish an answer nobody will use."""
        event = record.event
        if isinstance(event, (ev.CancelRequested, ev.SessionErased)):
            self.runner.interrupt(event.session_id, event.version)
        if is_experiment_session(event.session_id):
            return False  # replays run only in their experiment runner (tools answer from the recording)
        return resumes(record)

    async def handle(self, record: LogRecord) -> None:
        event = record.event
        if not isinstance(event, RESUMES):
            return  # a decision resumes a paused turn; a cancel may outlive its turn's dead worker
        async for item in self.runner.run(event.session_id):
            if self.on_item is not None:
                self.on_item(item)
        log.debug("worker.message_done", session=event.session_id, offset=record.offset)

    async def poll_once(self) -> int:
        """Run every turn the partitions call for now (concurrently), and return."""
        return await self.consumer.poll_once()

    async def run(self) -> None:
        """Run turns as messages arrive, until ``stop()``; then drain."""
        await self.consumer.run()

    def stop(self) -> None:
        self.consumer.stop()

    def _drain(self) -> None:
        self.runner.draining = True
