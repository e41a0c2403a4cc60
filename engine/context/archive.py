"""The session's archive: every message cut from the context, still on the log (seed §3.2).

``load_archive`` reads a session's events once and returns the originals of the messages that
``ContextTrimmed`` and ``HistorySummarized`` named. ``search`` ranks them for a query by word
overlap (BM25 over words cut to five characters, so "prefer" finds "preferred", and over
character pairs for Chinese, which has no spaces). ``refers_back`` spots a user message that
points at something said before ("what did I say at the start?", "我之前说的").
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from .. import events as ev
from ..fold import inherited_refs, renumbers
from ..log.base import EventLog
from ..messages import calls_text
from ..snapshot_format import decode

WORD = re.compile(r"[a-z0-9]+(?:[-_][a-z0-9]+)*|[\u4e00-\u9fff]+", re.IGNORECASE)
STOP = frozenset(
    "the a an and or of to in on for is are was were be it this that what which did do does i you we "
    "me my your our at with as by from about please can could would should will".split()
)
REFERS_BACK = re.compile(
    r"\b(what did (i|you|we)|did (i|you) (say|mention|tell|ask)|i (said|told you|mentioned|asked)|"
    r"you (said|told me|mentioned)|we (discussed|agreed|decided|talked about)|at the (start|beginning)|"
    r"in the beginning|remind me|go back to|(said|mentioned|told|asked|discussed|decided) (earlier|before|"
    r"previously))\b|之前|刚才|一开始|最开始|开头|我说过|我提到|我问过|你说过|我们(讨论|约定|说好|决定)|还记得|回到",
    re.IGNORECASE,
)
MENTIONS_START = re.compile(r"\b(start|beginning|first)\b|一开始|最开始|开头|最早", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    ref: int
    role: str
    text: str
    name: str = ""

    def quoted(self, limit: int = 600) -> str:
        who = f"tool {self.name}" if self.role == "tool" else self.role
        text = self.text if len(self.text) <= limit else self.text[:limit] + "…"
        return f"[{who}, #{self.ref}] {text}"


async def load_archive(log: EventLog, session_id: str) -> list[ArchivedMessage]:
    """The originals of every message cut from the session's context, oldest first. A fork's
    archive holds what its origin had archived by the fork (labelled below the fork's own
    refs) and the originals of inherited messages the fork cut."""
    originals, archived = await _archive(log, session_id, None)
    return [originals[ref] for ref in sorted(archived) if ref in originals]


Archive = tuple[dict[int, ArchivedMessage], set[int]]
"""(every message's original by ref, the refs cut from the context), in one session's refs."""


async def _archive(log: EventLog, session_id: str, upto: int | None) -> Archive:
    """The session's archive as of version ``upto`` (all of it if None)."""
    events = await log.read_session(session_id)
    if upto is not None:
        events = [e for e in events if e.version <= upto]
    originals: dict[int, ArchivedMessage] = {}
    archived: set[int] = set()
    if events and isinstance(events[0], ev.SessionForked):
        originals, archived = await _inherited(log, events[0])
    for e in events:
        if isinstance(e, ev.UserMessageReceived):
            originals[e.version] = ArchivedMessage(e.version, "user", e.text)
        elif isinstance(e, ev.AssistantMessage):
            calls = calls_text(e.tool_calls)
            text = e.text + (f" [calls {calls}]" if calls else "")
            originals[e.version] = ArchivedMessage(e.version, "assistant", text)
        elif isinstance(e, ev.ToolCallFinished):
            originals[e.version] = ArchivedMessage(e.version, "tool", e.content, e.tool_name)
        elif isinstance(e, ev.ContextTrimmed):
            archived.update(item["ref"] for item in json.loads(e.items_json))
        elif isinstance(e, ev.HistorySummarized):
            archived.update(json.loads(e.removed_refs_json))
    return originals, archived


async def _inherited(log: EventLog, forked: ev.SessionForked) -> Archive:
    """What a fork inherits of its origin's archive, in the fork's refs: the origin's archived
    messages (shifted below every inherited ref, oldest first), and the originals of the
    messages it inherited (by their renumbered refs), so the fork can archive those too."""
    origin_originals, origin_archived = await _archive(log, forked.origin_session_id, forked.origin_version)
    where = f"session {forked.session_id} v1 (fork of {forked.origin_session_id})"
    state = decode(forked.state_json, forked.state_format, where=where)
    count = len(state.messages) + len(state.inbox)
    shift = count + forked.origin_version + 1  # origin refs are at most its version: all end below -count
    originals = {ref - shift: dataclasses.replace(m, ref=ref - shift) for ref, m in origin_originals.items()}
    archived = {ref - shift for ref in origin_archived}
    if renumbers(forked):
        fork_refs = inherited_refs(len(state.messages), len(state.inbox))
        sources = [(m.ref, m.role, m.content, m.name or "") for m in state.messages]
        sources += [(m.version, "user", m.text, "") for m in state.inbox]
        for ref, (origin_ref, role, text, name) in zip(fork_refs, sources, strict=True):
            known = origin_originals.get(origin_ref)
            original = ArchivedMessage(ref, role, text, name) if known is None else known
            originals[ref] = dataclasses.replace(original, ref=ref)
    return originals, archived


def terms(text: str) -> list[str]:
    """Search terms: lower-case words cut to five characters, Chinese as character pairs."""
    out = []
    for token in WORD.findall(text.lower()):
        if "\u4e00" <= token[0] <= "\u9fff":
            out += [token[i : i + 2] for i in range(max(1, len(token) - 1))]
        elif token not in STOP:
            out.append(token[:5])
    return out


def search(archive: Sequence[ArchivedMessage], query: str, limit: int = 5) -> list[ArchivedMessage]:
    """The archived messages that best match ``query`` (BM25), best first; none without overlap."""
    wanted = set(terms(query))
    if not wanted or not archive:
        return []
    docs = [Counter(terms(m.text)) for m in archive]
    average = sum(sum(d.values()) for d in docs) / len(docs) or 1.0
    frequency = Counter(t for d in docs for t in wanted if t in d)
    scored = []
    for message, doc in zip(archive, docs, strict=True):
        length = sum(doc.values())
        score = 0.0
        for t in wanted:
            tf = doc.get(t, 0)
            if tf:
                idf = math.log(1 + (len(docs) - frequency[t] + 0.5) / (frequency[t] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / average))
        if score > 0:
            scored.append((score, message))
    scored.sort(key=lambda pair: -pair[0])
    return [m for _, m in scored[:limit]]


def refers_back(text: str) -> bool:
    return bool(REFERS_BACK.search(text))


def recall_for(archive: Sequence[ArchivedMessage], text: str, limit: int = 5) -> list[ArchivedMessage]:
    """What to bring back for a user message that refers back: the best matches, and the
    first things the user said when they ask about the start."""
    found = search(archive, text, limit)
    if MENTIONS_START.search(text):
        first = [m for m in archive if m.role == "user"][:2]
        found = first + [m for m in found if m not in first]
    return sorted(found[:limit], key=lambda m: m.ref)
