"""Tool calls whose worker dies, on both backends, with real worker processes SIGKILLed at an
exact point of the call (tests/keyed_crash.py) and a successor worker finishing the turn
(the crash rule: engine/tools/recovery.py):

* a tool that takes its call's idempotency key is run again with the same key after a kill at
  any point of the call (before it reached its service, after the service applied it, after it
  returned but before its result was on the log), and its effect lands once;
* a tool without a key is never run again: "interrupted, outcome unknown", one instruction;
* a call that kills every worker that starts it is paced, and given up only once it has been
  started ``max_starts`` times AND its ``crash_window_s`` has passed (the workers' clocks are
  injected, so the test does not wait out the window); the model is told what is known: the
  lookup's answer (applied, with its result; not applied) or unknown;
* a keyed call whose lookup says it was applied is finished with that result, not run again;
* an idempotent tool's batch is not committed before it runs (docs/architecture.md "Commits"):
  a worker killed in it leaves the model call that asked for it unanswered, and the successor
  asks again and runs the tool once more; one that kills every worker is still given up.

Kills from outside, unrelated to the tool, are in tests/test_tool_crash_storm.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.crash_support import Crashes, crash_backend, finish, of, open_session
from tests.fleet import deliver_late, deliveries, runs_by, side_effects
from tests.keyed_crash import POINTS, crash_agent
from turnlog.engine import events as ev
from turnlog.engine.tools import MARKERS, ToolStatus
from turnlog.engine.tools.recovery import restart_delay_ms

WINDOW_PASSED_S = 61.0
"""A successor's clock this far ahead: the default ``crash_window_s`` (60 s) has passed."""
UNKNOWN = "Whether it took effect is unknown. Tell the user it is not known whether it was done."


@pytest.fixture
async def crashes(backend: str, tmp_path: Path) -> AsyncIterator[Crashes]:
    async with crash_backend(backend, tmp_path) as found:
        yield found


def runs(crashes: Crashes, sid: str) -> list[tuple[str, ...]]:
    return [row for row in side_effects(crashes.target, crashes.schema) if row[0] == sid]


@pytest.mark.parametrize("point", POINTS)
async def test_a_keyed_tool_killed_mid_call_runs_again_with_its_key_and_lands_once(
    crashes: Crashes, point: str
) -> None:
    sid = f"{crashes.backend}-keyed-{point}"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("book", point)
    before = await crashes.producer.read_session(sid)
    assert [e.attempt for e in of(before, ev.ToolCallStarted)] == [1] and not of(before, ev.ToolCallFinished)

    events = await finish(crashes, sid, lambda b: crash_agent(b, "book", ""))

    first, again = of(events, ev.ToolCallStarted)
    assert (first.attempt, again.attempt) == (1, 2) and first.idempotency_key == again.idempotency_key
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.content, done.attempts) == ("success", "booked", 2)
    landed = [row for row in deliveries(crashes.target, crashes.schema) if row[0] == sid]
    assert landed == [(sid, "call-1", first.idempotency_key)], "the booking took effect exactly once"
    made = runs(crashes, sid)
    assert len(made) == (1 if point == "entry" else 2)  # a run killed at entry never reached the service
    assert {row[3] for row in made} == {first.idempotency_key}
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    assert of(events, ev.AssistantMessage)[-1].text == "done: booked"


async def test_a_tool_without_a_key_killed_after_its_effect_is_never_run_again(crashes: Crashes) -> None:
    sid = f"{crashes.backend}-keyless"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("page", "applied")

    events = await finish(crashes, sid, lambda b: crash_agent(b, "page", ""))

    assert [e.attempt for e in of(events, ev.ToolCallStarted)] == [1]
    (done,) = of(events, ev.ToolCallFinished)
    assert done.status == "interrupted"
    assert done.content == (
        f"{MARKERS[ToolStatus.INTERRUPTED]} page was running when its worker stopped, and it is not run "
        f"again, since a repeat could do it twice. {UNKNOWN}"
    )
    assert len(runs(crashes, sid)) == 1, "paged once, by the killed worker; never again"
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"


async def test_a_keyed_call_that_kills_every_worker_is_paced_then_given_up_after_count_and_window(
    crashes: Crashes,
) -> None:
    sid = f"{crashes.backend}-crash-loop"
    await open_session(crashes, sid)
    for _ in range(3):  # max_starts=2, but the window (60 s) has not passed: a third start, paced
        await crashes.run_dying_worker("book", "entry", max_starts=2)
    started = of(await crashes.producer.read_session(sid), ev.ToolCallStarted)
    assert [e.attempt for e in started] == [1, 2, 3], "two starts alone do not give it up"
    assert started[2].time_ms - started[1].time_ms >= restart_delay_ms(2) == 1000, "the third start waited"

    agent = lambda b: crash_agent(b, "book", "", max_starts=2)  # noqa: E731
    events = await finish(crashes, sid, agent, offset_s=WINDOW_PASSED_S)

    assert len(of(events, ev.ToolCallStarted)) == 3, "not started a fourth time"
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.attempts) == ("abandoned", 3)
    assert re.fullmatch(
        re.escape(MARKERS[ToolStatus.ABANDONED]) + r" book was started 3 times over \d+ s and each time the "
        r"worker running it stopped before it returned, so it is not started again\. " + re.escape(UNKNOWN),
        done.content,
    ), done.content
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    assert of(events, ev.AssistantMessage)[-1].text.startswith("done: [FAILED: ABANDONED")
    assert runs(crashes, sid) == []


@pytest.mark.parametrize("answer", ["not_applied", "applied_late", "down"])
async def test_a_given_up_keyed_call_is_reported_as_its_lookup_says(crashes: Crashes, answer: str) -> None:
    """The lookup is asked before the call is given up: a key the service applied (here late,
    after the worker that sent it died) is the call's result; one it has not is "not done, safe
    to call again"; a service that cannot be asked leaves it unknown. One instruction each."""
    sid = f"{crashes.backend}-given-up-{answer}"
    lookup = "down" if answer == "down" else "store"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("book", "entry", max_starts=1, lookup=lookup)
    (started,) = of(await crashes.producer.read_session(sid), ev.ToolCallStarted)
    if answer == "applied_late":
        deliver_late(crashes.target, crashes.schema, sid, "call-1", started.idempotency_key)

    agent = lambda b: crash_agent(b, "book", "", max_starts=1, lookup=lookup)  # noqa: E731
    events = await finish(crashes, sid, agent, offset_s=WINDOW_PASSED_S)

    assert len(of(events, ev.ToolCallStarted)) == 1, "given up, not started again"
    (done,) = of(events, ev.ToolCallFinished)
    told = of(events, ev.AssistantMessage)[-1].text
    if answer == "applied_late":
        assert (done.status, done.content, done.attempts) == ("success", "booked", 1)
        assert told == "done: booked", "the model is told what the service knows"
    elif answer == "not_applied":
        assert done.status == "abandoned" and done.content.endswith(
            "so it is not started again. Its system reports the request was not applied, so nothing was "
            "done and calling book again is safe. Tell the user it was not done."
        )
    else:
        assert done.status == "abandoned" and done.content.endswith(
            f"so it is not started again. Its system could not say. {UNKNOWN}"
        )
        assert done.error and "lookup failed: ConnectionError: the booking service is down" in done.error
    assert runs(crashes, sid) == [], "the tool itself never ran past its entry"


@pytest.mark.parametrize("point", ["entry", "applied"])
async def test_a_keyed_call_its_lookup_knows_applied_is_not_run_again(crashes: Crashes, point: str) -> None:
    """Before a crashed keyed call is started again its lookup is asked: applied -> finished with
    that result and not run again; not applied -> run again with its key."""
    sid = f"{crashes.backend}-known-{point}"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("book", point, lookup="store")

    events = await finish(crashes, sid, lambda b: crash_agent(b, "book", "", lookup="store"))

    starts = of(events, ev.ToolCallStarted)
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.content) == ("success", "booked")
    assert [e.attempt for e in starts] == ([1, 2] if point == "entry" else [1])
    assert done.attempts == len(starts)
    by_successor = runs_by(crashes.target, crashes.schema, "successor")
    assert len(by_successor) == (1 if point == "entry" else 0), "run again only when not applied"
    assert [row[0] for row in deliveries(crashes.target, crashes.schema) if row[0] == sid] == [sid]
    assert of(events, ev.AssistantMessage)[-1].text == "done: booked"


@pytest.mark.parametrize("point", ["entry", "applied"])
async def test_an_idempotent_tool_killed_mid_call_is_run_once_more_after_recovery(
    crashes: Crashes, point: str
) -> None:
    sid = f"{crashes.backend}-idempotent-{point}"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("lookup", point)
    before = await crashes.producer.read_session(sid)
    # its batch rides the next commit: the log ends with the model call that asked for it
    assert before[-1].type == "ModelCallStarted" and not of(before, ev.ToolCallStarted)
    assert not of(before, ev.AssistantMessage)

    events = await finish(crashes, sid, lambda b: crash_agent(b, "lookup", ""))

    assert len(runs(crashes, sid)) == (1 if point == "entry" else 2), "run once more by the successor"
    (started,) = of(events, ev.ToolCallStarted)
    assert started.attempt == 1 and started.producer != before[-1].producer
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.content, done.attempts) == ("success", "free", 1)
    # the model call the killed worker made is recorded interrupted and made again
    statuses = [e.status for e in of(events, ev.ModelCallFinished)]
    assert statuses == ["interrupted", "ok", "ok"]
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    assert of(events, ev.AssistantMessage)[-1].text == "done: free"


async def test_an_idempotent_tool_that_kills_every_worker_is_given_up_after_its_bound(
    crashes: Crashes,
) -> None:
    """The first death leaves no start on the log; the successor that found the model call
    unanswered commits its batch before running it, so the rule counts from there."""
    sid = f"{crashes.backend}-idempotent-loop"
    await open_session(crashes, sid)
    for _ in range(3):  # max_starts=2: one unrecorded death, then two recorded starts
        await crashes.run_dying_worker("lookup", "entry", max_starts=2)
    started = of(await crashes.producer.read_session(sid), ev.ToolCallStarted)
    assert [e.attempt for e in started] == [1, 2]

    agent = lambda b: crash_agent(b, "lookup", "", max_starts=2)  # noqa: E731
    events = await finish(crashes, sid, agent, offset_s=WINDOW_PASSED_S)

    assert len(of(events, ev.ToolCallStarted)) == 2, "not started a third time"
    (done,) = of(events, ev.ToolCallFinished)
    assert (done.status, done.attempts) == ("abandoned", 2)
    assert done.content.endswith(
        "so it is not started again. It returned no result. Tell the user it could not be completed."
    )
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "answered"
    assert runs(crashes, sid) == []


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("lookup", ["", "store"])
async def test_a_keyed_call_a_stop_ends_after_its_worker_died_is_reported_as_known(
    crashes: Crashes, lookup: str
) -> None:
    """A cancel that arrives while the call's worker is dead: the call is not run again (the
    turn stops), and the model is told what its lookup knows, or that the outcome is unknown;
    never "not safe to repeat", which is false of a keyed tool."""
    sid = f"stopped-{lookup or 'no-lookup'}"
    await open_session(crashes, sid)
    await crashes.run_dying_worker("book", "applied", lookup=lookup)
    cancel = ev.CancelRequested(session_id=sid, version=0, reason="changed my mind", actor="user")
    await crashes.producer.submit(cancel)

    events = await finish(crashes, sid, lambda b: crash_agent(b, "book", "", lookup=lookup))

    assert len(of(events, ev.ToolCallStarted)) == 1 and len(runs(crashes, sid)) == 1
    (done,) = of(events, ev.ToolCallFinished)
    if lookup:
        assert (done.status, done.content, done.attempts) == ("success", "booked", 1)
    else:
        assert (done.status, done.content) == (
            "interrupted",
            f"{MARKERS[ToolStatus.INTERRUPTED]} book was running when its worker stopped, and the turn was "
            f"stopped before it could run again. {UNKNOWN}",
        )
    (finished,) = of(events, ev.TurnFinished)
    assert finished.reason == "cancelled"
