"""docs/architecture.md stays true: its event catalogue and transition table match the code."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from turnlog.engine.codec import ENVELOPE_FIELDS
from turnlog.engine.events import EVENT_TYPES
from turnlog.engine.states import TRANSITIONS

DOC = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()


def table_rows(marker: str) -> list[list[str]]:
    block = re.search(rf"<!-- {marker}:start -->(.*?)<!-- {marker}:end -->", DOC, re.S)
    assert block, f"docs/architecture.md lost its {marker} table markers"
    lines = [ln for ln in block.group(1).strip().splitlines()[2:] if ln.startswith("|")]
    return [[cell.strip() for cell in ln.strip("|").split("|")] for ln in lines]


def test_event_catalogue_lists_every_event_with_its_payload() -> None:
    rows = {row[0]: row[1] for row in table_rows("events")}
    assert set(rows) == set(EVENT_TYPES)
    for name, cls in EVENT_TYPES.items():
        payload = [f.name for f in dataclasses.fields(cls) if f.name not in ENVELOPE_FIELDS]
        assert [p.strip() for p in rows[name].split(",")] == payload, name


def test_transition_table_is_the_code_table() -> None:
    documented = {(r[0], r[1]): {c.strip() for c in r[2].split(",")} for r in table_rows("transitions")}
    actual = {(str(a), str(b)): {str(c) for c in causes} for (a, b), causes in TRANSITIONS.items()}
    assert documented == actual
