"""The memory consumer: writes long-term memories off the turn's path (seed §3.3).

Two moments write a memory. A ``MemoryNoted`` (the model's ``remember`` tool: the user said
"remember this") is stored at once. At the end of a task (``TurnFinished`` with reason
"answered") the turn's user and assistant messages are read back from the log, from the user
message on (the consumer notes where each message is as it reads the partition; only after a
restart in the middle of a turn does it read the whole session), and an extraction model lists
the facts worth keeping, each tagged preference, conclusion or agreement.

``agent_ids`` limits it to the sessions of some agents (the ones whose ``MemoryPolicy`` names
its store); ``owned_only`` to the partitions its log owns (a Kafka turn worker: its offsets then
ride the owner's transactions).

It is a consumer group on the log (``GROUP``), committing after each record, so a restart
resumes where it stopped. A record handled twice (a crash before its commit, or a re-run from
offset 0) writes nothing twice: the store's dedup treats the same fact at the same or an older
time as already stored. A model answer that is not a usable list is logged and skipped; a store
that is down leaves the record uncommitted, to be retried.

Every extraction call is recorded on its session's log (an ``AuxiliaryModelCall``, submitted
like a user message, with the provider's usage or, for a call that failed, what was sent and
what streamed, estimated; priced by ``prices``), so it counts in the session's and the user's
cost like the turn's own calls. A call made again after a crash is recorded again: it was made.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Collection, Sequence

import json_repair
import structlog

from turnlog.consumers.runner import GroupConsumer
from turnlog.engine import usage
from turnlog.engine.crypto.fields import ERASED_TEXT, is_erased
from turnlog.engine.errors import InputError, LogUnavailableError, MemoryStoreError, ModelError
from turnlog.engine.events import (
    AssistantMessage,
    AuxiliaryModelCall,
    Event,
    MemoryNoted,
    SessionCreated,
    SessionErased,
    SessionForked,
    TurnFinished,
    UserMessageReceived,
)
from turnlog.engine.experiments.namespace import is_experiment_session
from turnlog.engine.fold import fold
from turnlog.engine.log.base import EventLog, LogRecord
from turnlog.engine.memory.base import MemoryStore, MemoryTag
from turnlog.engine.messages import ChatMessage
from turnlog.engine.models.base import Model, ModelRequest, ModelResponse, TextDelta
from turnlog.engine.models.pricing import PriceTable

GROUP = "memory"
EXTRACTION_TIMEOUT_S = 120.0
MAX_FACTS = 10
"""At most this many facts are kept from one task (seed: more memories are not better)."""
REMEMBERED_POSITIONS = 10_000
"""Where recent user messages and sessions' agents are, kept per consumer (oldest dropped first)."""

EXTRACTION_PROMPT = """You keep an assistant's long-term memory about one user.
Read the conversation below and list only the facts worth remembering in later sessions:
- preference: how the user wants things done (carriers, formats, languages, schedules)
- conclusion: a business conclusion reached and confirmed (with its ids and numbers)
- agreement: something agreed with the user for the future
Skip small talk, one-off questions and anything only true for this conversation.
Write each fact as one short self-contained sentence in the conversation's language, keeping
exact ids, numbers and names. Answer with JSON only, a list, empty if nothing is worth keeping:
[{"fact": "...", "tag": "preference" | "conclusion" | "agreement"}]"""

_TAGS = frozenset(t.value for t in MemoryTag)
log = structlog.get_logger("turnlog.memory")


@dataclass(frozen=True, slots=True)
class ExtractedFact:
    text: str
    tag: str


def parse_facts(text: str) -> tuple[list[ExtractedFact], list[str]]:
    """(facts, problems): the usable items of a model's answer, and why any item was dropped.

    Tolerant of fences, prose around the JSON, single quotes and trailing commas; an object with
    a "facts" list is accepted too.
    """
    value: Any = json_repair.loads(text) if text.strip() else []
    if isinstance(value, dict) and isinstance(value.get("facts"), list):
        value = value["facts"]
    if not isinstance(value, list):
        return [], [f"the answer is not a JSON list of facts: {text[:200]!r}"]
    facts, problems = [], []
    for item in value:
        fact = item.get("fact") if isinstance(item, dict) else None
        tag = item.get("tag") if isinstance(item, dict) else None
        if not isinstance(fact, str) or not fact.strip():
            problems.append(f"no fact text in {item!r}")
        elif tag not in _TAGS:
            problems.append(f"tag {tag!r} is not one of {sorted(_TAGS)} in {item!r}")
        else:
            facts.append(ExtractedFact(fact.strip(), str(tag)))
    return facts[:MAX_FACTS], problems


def transcript(events: Sequence[Event], turn: TurnFinished) -> str:
    """The turn's user message and assistant texts, in order, as the extraction model reads them."""
    lines = []
    for event in events:
        if isinstance(event, UserMessageReceived) and event.message_id == turn.message_id:
            lines.append(f"User: {event.text}")
        elif isinstance(event, AssistantMessage) and event.turn_id == turn.turn_id and event.text.strip():
            lines.append(f"Assistant: {event.text}")
    return "\n".join(lines)


class MemoryConsumer:
    """Tails the log and writes memories into ``store``; ``extractor`` None turns off extraction
    at the end of a task (explicit ``remember`` notes are still stored)."""

    def __init__(
        self,
        event_log: EventLog,
        store: MemoryStore,
        extractor: Model | None = None,
        *,
        group: str = GROUP,
        partitions: Sequence[int] | None = None,
        owned_only: bool = False,
        agent_ids: Collection[str] | None = None,
        batch: int = 200,
        idle_wait_s: float = 0.5,
        extraction_timeout_s: float = EXTRACTION_TIMEOUT_S,
        prices: PriceTable | None = None,
    ) -> None:
        self.log = event_log
        self.store = store
        self.extractor = extractor
        self.prices = prices
        """Prices the extraction calls recorded on the log (None: they cost 0)."""
        self.extraction_timeout_s = extraction_timeout_s
        self.agent_ids = frozenset(agent_ids) if agent_ids is not None else None
        self._messages: OrderedDict[tuple[str, str], tuple[int, str]] = OrderedDict()
        """(session, message id) -> (version, user id) of user messages read, until their turn ends."""
        self._agents: OrderedDict[str, str] = OrderedDict()
        # every partition by default, like analytics (a Kafka process that owns none reads them
        # all); owned_only: the partitions the log owns at each poll (GroupConsumer's default)
        chosen = None if owned_only else range(event_log.partitions) if partitions is None else partitions
        self.consumer = GroupConsumer(
            event_log, group, self.handle, partitions=chosen, batch=batch, idle_wait_s=idle_wait_s
        )

    async def catch_up(self) -> int:
        """Handle everything beyond the group's committed offsets; return records read."""
        return await self.consumer.poll_once()

    async def run(self) -> None:
        await self.consumer.run()

    def stop(self) -> None:
        self.consumer.stop()

    async def handle(self, record: LogRecord) -> None:
        event = record.event
        if isinstance(event, (SessionCreated, SessionForked)):
            _remember(self._agents, event.session_id, event.agent_id)
        elif isinstance(event, UserMessageReceived):
            _remember(self._messages, (event.session_id, event.message_id), (event.version, event.user_id))
        if (
            not isinstance(event, (MemoryNoted, TurnFinished, SessionErased))
            or is_experiment_session(event.session_id)  # a replay never writes a user's memories
            or not await self._serves(event.session_id)
        ):
            return
        try:
            if isinstance(event, SessionErased):
                await self._forget(event)
            elif isinstance(event, MemoryNoted):
                await self._note(event)
            elif event.reason == "answered" and self.extractor:
                await self._extract(event)
        except MemoryStoreError as exc:
            raise LogUnavailableError(f"memory store unavailable, record retried later: {exc}") from exc
        finally:
            if isinstance(event, TurnFinished):
                self._messages.pop((event.session_id, event.message_id), None)

    async def _serves(self, session_id: str) -> bool:
        """Whether the session's agent writes to this consumer's store."""
        if self.agent_ids is None:
            return True
        agent = self._agents.get(session_id)
        if agent is None:  # created before the offset this consumer started from
            agent = fold(session_id, (await self.log.read_session(session_id))[:1]).agent_id
            _remember(self._agents, session_id, agent)
        return agent in self.agent_ids

    async def _forget(self, erased: SessionErased) -> None:
        """An erasure: the user's memories (or the session's) leave the store and its files.
        The eraser does it too where it holds the store; this covers a store that only the
        process running this consumer can open (an embedded one). Idempotent."""
        user = erased.user_id if erased.scope == "user" and erased.user_id else None
        deleted = await self.store.forget(user, sessions=() if user else (erased.session_id,))
        if deleted:
            await self.store.compact()
            log.info("memory.erased", session_id=erased.session_id, scope=erased.scope, deleted=deleted)

    async def _note(self, event: MemoryNoted) -> None:
        if is_erased(event.text):  # read again after its session was erased: nothing to keep
            return
        try:
            await self.store.remember(
                event.user_id, event.text, event.tag, source=event.session_id, time_ms=event.time_ms
            )
        except InputError as exc:
            log.warning(
                "memory.note_skipped", session_id=event.session_id, call_id=event.call_id, error=str(exc)
            )

    async def _extract(self, turn: TurnFinished) -> None:
        """Read the turn from its user message on (the whole session if this consumer did not
        see the message), and store the facts the extraction model lists."""
        version, user_id = self._messages.get((turn.session_id, turn.message_id), (0, ""))
        events = await self.log.read_session(turn.session_id, max(version - 1, 0))
        if not user_id:
            user_id = await self._user_of(turn.session_id, events)
        text = transcript(events, turn)
        if not user_id or not text or ERASED_TEXT in text:  # an erased turn: nothing to learn
            return
        answer = await self._ask(turn, text)
        if answer is None:
            return
        facts, problems = parse_facts(answer)
        if problems:
            log.warning("memory.extraction_unusable", session_id=turn.session_id, problems=problems[:5])
        for fact in facts:
            await self.store.remember(
                user_id, fact.text, fact.tag, source=turn.session_id, time_ms=turn.time_ms
            )

    async def _user_of(self, session_id: str, events: Sequence[Event]) -> str:
        """The session's user: on its first event (a message written without one: old logs)."""
        first = (
            events[:1] if events and events[0].version == 1 else (await self.log.read_session(session_id))[:1]
        )
        return fold(session_id, first).user_id

    async def _ask(self, turn: TurnFinished, text: str) -> str | None:
        """The extraction model's answer text, or None (logged) when the call fails. Either way
        the call is recorded on the session's log with what it cost."""
        extractor = self.extractor
        assert extractor is not None
        request = ModelRequest(
            messages=[ChatMessage.system(EXTRACTION_PROMPT), ChatMessage.user(text)],
            session_id=turn.session_id,
            turn_id=turn.turn_id,
        )
        sent = await extractor.estimate_input_tokens(request)
        started = time.perf_counter()
        streamed: list[str] = []
        response: ModelResponse | None = None
        error = ""
        try:
            asked = _answer(extractor, request, streamed)
            response = await asyncio.wait_for(asked, self.extraction_timeout_s)
        except (ModelError, TimeoutError) as exc:
            error = str(exc) or type(exc).__name__
            log.warning("memory.extraction_failed", session_id=turn.session_id, error=error)
        latency = round((time.perf_counter() - started) * 1000, 3)
        model = (response.model if response is not None else "") or extractor.name
        if response is not None:
            spent = usage.priced(self.prices, [model, extractor.name], response.usage)
        else:
            counter = extractor.token_counter
            spent = usage.unanswered(self.prices, extractor.name, sent, "".join(streamed), counter)
        await self._record(turn, model, spent, latency, error)
        return response.text if response is not None else None

    async def _record(
        self, turn: TurnFinished, model: str, spent: usage.Spent, latency: float, error: str
    ) -> None:
        call = AuxiliaryModelCall(
            session_id=turn.session_id,
            version=0,
            producer="memory",
            causation_id=turn.event_id,
            correlation_id=turn.turn_id,
            turn_id=turn.turn_id,
            purpose="memory_extraction",
            model=model,
            status="failed" if error else "ok",
            input_tokens=spent.input_tokens,
            output_tokens=spent.output_tokens,
            cached_input_tokens=spent.cached_input_tokens,
            cost_micros=spent.cost_micros,
            latency_ms=latency,
            estimated=spent.estimated,
            error=error[:500],
        )
        await self.log.submit(call)


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    if len(cache) > REMEMBERED_POSITIONS:
        cache.popitem(last=False)


async def _answer(model: Model, request: ModelRequest, streamed: list[str]) -> ModelResponse:
    async for chunk in model.stream(request):
        if isinstance(chunk, ModelResponse):
            return chunk
        if isinstance(chunk, TextDelta):
            streamed.append(chunk.text)
    raise ModelError(f"{model.name}: the stream ended without a complete answer")
