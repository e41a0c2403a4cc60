"""docs/architecture.md stays true: its event catalogue, transition table and layout table match
the code."""

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


REPO = Path(__file__).resolve().parent.parent


def layout_rows() -> list[tuple[list[str], str]]:
    """The layout table: each row's paths (a bare name after a path is in that path's folder,
    as in "`turnlog/local_model.py`, `local_server.py`") and its text."""
    section = DOC[DOC.index("## Layout") : DOC.index("## Event catalogue")]
    rows = []
    for line in section.splitlines():
        cells = line.strip("|").split("|", 1)
        if not line.startswith("| `") or len(cells) < 2:
            continue
        paths: list[str] = []
        for token in re.findall(r"`([^`]+)`", cells[0]):
            folder = paths[-1].rpartition("/")[0] if paths and "/" not in token else ""
            paths.append(f"{folder}/{token}" if folder else token)
        rows.append((paths, cells[1]))
    return rows


def _named(module: Path, rows: list[tuple[list[str], str]]) -> bool:
    """Whether a row names ``module``: by its path, or by its file name in the row of a folder
    that holds it."""
    rel = module.relative_to(REPO).as_posix()
    for paths, text in rows:
        if rel in paths:
            return True
        folders = [p for p in paths if p.endswith("/") and rel.startswith(p)]
        if folders and f"`{module.name}`" in text:
            return True
    return False


def test_the_layout_table_names_every_product_module() -> None:
    from tests.test_import_graph import turnlog_modules

    rows = layout_rows()
    modules = [p for p in turnlog_modules().values() if p.name not in ("__init__.py",)]
    missing = sorted(str(p.relative_to(REPO)) for p in modules if not _named(p, rows))
    assert not missing, f"name these in docs/architecture.md's layout table: {missing}"


def test_every_path_the_layout_table_names_exists() -> None:
    stale = []
    for paths, text in layout_rows():
        for path in paths:
            if "*" not in path and not (REPO / path).exists():
                stale.append(path)
        folders = [REPO / p for p in paths if p.endswith("/")]
        for name in re.findall(r"`([\w/]+\.py)`", text) if folders else ():
            found = (REPO / name).exists() if "/" in name else any(any(f.rglob(name)) for f in folders)
            if not found:
                stale.append(f"{name} (row {', '.join(paths)})")
    assert not stale, f"docs/architecture.md's layout table names what is not there: {stale}"
