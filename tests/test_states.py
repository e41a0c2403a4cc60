"""The transition table: every edge, every cause, and what is not an edge."""

from __future__ import annotations

import itertools

import pytest

from turnlog.engine.errors import IllegalTransitionError
from turnlog.engine.states import RESTING, TRANSITIONS, Cause, SessionStatus, check_transition

S, C = SessionStatus, Cause

ALLOWED = [(a, b, cause) for (a, b), causes in TRANSITIONS.items() for cause in sorted(causes)]
REFUSED = [(a, b, cause) for (a, b), causes in TRANSITIONS.items() for cause in sorted(set(C) - causes)]
NON_EDGES = [(a, b) for a, b in itertools.product(S, S) if (a, b) not in TRANSITIONS]


def test_the_table_covers_every_state() -> None:
    touched = {s for edge in TRANSITIONS for s in edge}
    assert touched == set(S)
    assert all(TRANSITIONS.values()), "an edge with no allowed cause could never be taken"


@pytest.mark.parametrize(("from_state", "to_state", "cause"), ALLOWED)
def test_every_edge_is_accepted_with_each_allowed_cause(from_state: S, to_state: S, cause: C) -> None:
    check_transition(from_state, to_state, cause)
    check_transition(str(from_state), str(to_state), str(cause))  # plain strings, as read from the log


@pytest.mark.parametrize(("from_state", "to_state", "cause"), REFUSED)
def test_every_edge_refuses_the_causes_it_does_not_allow(from_state: S, to_state: S, cause: C) -> None:
    with pytest.raises(IllegalTransitionError, match=f"cannot be caused by {cause}") as caught:
        check_transition(from_state, to_state, cause)
    # the message lists what would have been allowed
    for allowed in TRANSITIONS[(from_state, to_state)]:
        assert str(allowed) in str(caught.value)


def test_every_edge_refuses_at_least_one_cause() -> None:
    assert {(a, b) for a, b, _ in REFUSED} == set(TRANSITIONS)


@pytest.mark.parametrize(
    ("from_state", "to_state", "cause"),
    [
        (S.FINISHED, S.TOOL_WAIT, C.MODEL_TOOL_CALL),
        (S.IDLE, S.TOOL_LOOP, C.MODEL_TOOL_CALL),
        (S.ERROR, S.ERROR, C.MODEL_ERROR),
        (S.FINISHED, S.FINISHED, C.ADMIN),
        (S.CANCELLED, S.CANCELLED, C.INTERRUPT),
        (S.ERROR, S.CANCELLED, C.INTERRUPT),
        (S.TOOL_WAIT, S.TOOL_LOOP, C.MODEL_TOOL_CALL),
        (S.TOOL_LOOP, S.TOOL_WAIT, C.MODEL_TOOL_CALL),
        (S.FINISHED, S.IDLE, C.ADMIN),
        (S.PROCESSING, S.IDLE, C.MODEL_ANSWER),
        (S.TOOL_WAIT, S.ERROR, C.MODEL_ERROR),
        (S.PAUSED_FOR_USER, S.ERROR, C.MODEL_ERROR),
    ],
)
def test_sample_of_non_edges_raise(from_state: S, to_state: S, cause: C) -> None:
    assert (from_state, to_state) not in TRANSITIONS
    with pytest.raises(IllegalTransitionError, match=f"no transition {from_state} -> {to_state}"):
        check_transition(from_state, to_state, cause)


@pytest.mark.parametrize(("from_state", "to_state"), NON_EDGES)
def test_no_cause_makes_a_non_edge_legal(from_state: S, to_state: S) -> None:
    for cause in C:
        with pytest.raises(IllegalTransitionError):
            check_transition(from_state, to_state, cause)


def test_cancelled_to_finished_is_an_admin_edge_only() -> None:
    check_transition(S.CANCELLED, S.FINISHED, C.ADMIN)
    with pytest.raises(IllegalTransitionError):
        check_transition(S.CANCELLED, S.FINISHED, C.MODEL_ANSWER)


def test_no_state_transitions_to_itself() -> None:
    assert not [edge for edge in TRANSITIONS if edge[0] == edge[1]]


@pytest.mark.parametrize(
    ("from_state", "to_state", "cause"),
    [
        ("SLEEPING", "PROCESSING", "user_message"),
        ("IDLE", "DONE", "user_message"),
        ("IDLE", "PROCESSING", "because"),
        ("idle", "processing", "user_message"),  # states are upper case on the log
        ("IDLE", "PROCESSING", "USER_MESSAGE"),  # causes are lower case
        ("", "", ""),
    ],
)
def test_unknown_state_or_cause_strings_raise(from_state: str, to_state: str, cause: str) -> None:
    with pytest.raises(IllegalTransitionError, match="unknown state or cause"):
        check_transition(from_state, to_state, cause)


def test_resting_states_are_exactly_those_a_user_message_moves_to_processing() -> None:
    starts_turn = {
        a for (a, b), causes in TRANSITIONS.items() if b == S.PROCESSING and C.USER_MESSAGE in causes
    }
    assert RESTING == starts_turn
    assert RESTING == {S.IDLE, S.FINISHED, S.ERROR, S.CANCELLED}


def test_a_user_message_never_moves_a_running_turn() -> None:
    running = set(S) - RESTING
    for (a, _), causes in TRANSITIONS.items():
        if a in running:
            assert C.USER_MESSAGE not in causes, a
