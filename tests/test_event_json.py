"""What the gateway sends of an event (its answers, its SSE streams, the viewer): every field
of every event type, as ``dataclasses.asdict`` gives it, with its type; a state body as its size."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.test_codec import sample
from turnlog.engine.events import EVENT_TYPES
from turnlog.gateway.access import HEAVY, event_json


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_an_events_json_has_every_field_as_asdict_gives_it(name: str) -> None:
    event = sample(EVENT_TYPES[name])
    expected = dataclasses.asdict(event)
    if type(event) in HEAVY:
        expected["state_json_chars"] = len(expected.pop("state_json"))
    expected["type"] = event.type
    body = event_json(event)
    assert body == expected
    assert json.dumps(body) == json.dumps(expected)
