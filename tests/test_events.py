"""Making events: every event class's ``__init__`` (engine.events.envelope.quick_init, which sets the
slots through their descriptors) takes exactly the fields its dataclass declares, keyword only,
with the same defaults and factories, and the event stays frozen, comparable and hashable."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tests.test_codec import sample
from turnlog.engine.events import EVENT_TYPES, Event, StateChanged

NAMES = sorted(EVENT_TYPES)


@pytest.mark.parametrize("name", NAMES)
def test_init_takes_the_dataclass_fields_keyword_only_with_their_defaults(name: str) -> None:
    cls = EVENT_TYPES[name]
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    for p, f in zip(params, fields, strict=True):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        assert (p.default is inspect.Parameter.empty) == required, f.name
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default, f.name


@pytest.mark.parametrize("name", NAMES)
def test_every_value_given_is_kept_and_every_one_left_out_takes_its_default(name: str) -> None:
    cls = EVENT_TYPES[name]
    full = sample(cls)  # a distinct value in every field
    given = {f.name: getattr(full, f.name) for f in dataclasses.fields(cls)}
    rebuilt = cls(**given)
    assert {name: getattr(rebuilt, name) for name in given} == given  # each in its own slot
    required = {
        f.name: getattr(full, f.name)
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    bare = cls(**required)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            assert getattr(bare, f.name) == f.default, f.name
        elif f.name in required:
            assert getattr(bare, f.name) == required[f.name], f.name
    assert dataclasses.replace(full) == full
    assert hash(dataclasses.replace(full)) == hash(full)


def test_factories_run_once_per_event_and_only_when_the_value_is_left_out() -> None:
    made = [StateChanged(session_id="s", version=1, from_state="IDLE", to_state="PROCESSING", cause="c")]
    made.append(dataclasses.replace(made[0], event_id="given", time_ms=7))
    made.append(StateChanged(session_id="s", version=1, from_state="IDLE", to_state="PROCESSING", cause="c"))
    assert (made[1].event_id, made[1].time_ms) == ("given", 7)
    assert made[0].event_id != made[2].event_id
    assert made[0].time_ms > 0


def test_a_missing_field_an_unknown_one_or_a_positional_value_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="from_state"):
        StateChanged(session_id="s", version=1, to_state="PROCESSING", cause="c")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="colour"):
        StateChanged(session_id="s", version=1, from_state="a", to_state="b", cause="c", colour=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        StateChanged("s", 1)  # type: ignore[misc]


def test_an_event_stays_frozen() -> None:
    event: Event = StateChanged(
        session_id="s", version=1, from_state="IDLE", to_state="PROCESSING", cause="c"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.version = 2  # type: ignore[misc]
