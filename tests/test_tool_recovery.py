"""The crash rule itself (engine/tools/recovery.py), a pure function of a call's starts and the
clock: when a call left started is run again, waits, or is given up. Its effect on real worker
processes is in tests/test_tool_crashes.py and tests/test_tool_crash_storm.py."""

from __future__ import annotations

from dataclasses import dataclass

from turnlog.engine import tool
from turnlog.engine.tools.recovery import Paced, after_crash, poison_bound, restart_delay_ms

S = 1000


@dataclass
class Starts:
    attempts: int
    first_started_ms: int
    last_started_ms: int


@tool(idempotent=True)
def read(ref: str) -> str:
    """Read a record."""
    return ref


@tool(max_starts=2, crash_window_s=0)
def send(ref: str, idempotency_key: str) -> str:
    """Send with a key; given up on count alone (no window)."""
    return ref


def test_the_second_start_is_at_once_and_later_ones_are_paced_up_to_eight_seconds() -> None:
    assert [restart_delay_ms(n) for n in range(1, 8)] == [0, 1 * S, 2 * S, 4 * S, 8 * S, 8 * S, 8 * S]
    assert after_crash(read, Starts(1, 0, 0), 1) == "rerun"
    assert after_crash(read, Starts(3, 0, 10 * S), 11 * S) == Paced(12 * S)
    assert after_crash(read, Starts(3, 0, 10 * S), 12 * S) == "rerun"


def test_a_call_is_given_up_only_after_max_starts_and_its_window() -> None:
    assert read.max_starts == 5 and read.crash_window_s == 60
    assert after_crash(read, Starts(9, 0, 50 * S), 59 * S) == "rerun", "many starts, window not passed"
    assert after_crash(read, Starts(4, 0, 100 * S), 200 * S) == "rerun", "window passed, too few starts"
    assert after_crash(read, Starts(5, 0, 55 * S), 60 * S) == "give_up"
    # past the count, the next decision is the window's end if that comes before the pacing's
    assert after_crash(read, Starts(5, 0, 55 * S), 58 * S) == Paced(60 * S)
    assert after_crash(send, Starts(2, 0, 0), 0) == "give_up"


def test_the_documented_bound_of_a_tool_that_kills_every_worker() -> None:
    """docs/architecture.md and README state it: 11 deaths, given up a minute after the first
    start, with instant takeovers (each takeover that takes longer than the pacing means fewer)."""
    assert poison_bound(read) == (11, 60.0)
    assert poison_bound(send) == (2, 0.0)
