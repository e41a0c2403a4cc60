"""The files of an analytics export: Parquet data files by dataset and day, and the export's
committed position, in one output directory.

    OUT/_turnlog_export.json                 the committed position (next offset per partition)
    OUT/.turnlog_export.lock                 held by the export writing here
    OUT/<dataset>/day=YYYY-MM-DD/p<partition>-<first offset>-<end offset>.parquet

A data file holds the rows that one flush of one log partition made for one dataset and day,
and its name says which offsets it covers (first, and end exclusive). The committed position
moves only after every file it covers is durable (each written under a temporary name, fsynced,
renamed, and its folders fsynced), and is itself replaced by write-then-rename. So after a crash
every file either lies below its partition's committed offset (exported) or starts at or after
it (a leftover of the killed flush): ``remove_leftovers`` deletes those before the export goes
on, and their offsets are exported again. Readers that glob ``*.parquet`` never see a file
being written (those end in ``.tmp``).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from turnlog.engine.errors import ExportError
from turnlog.projections.export_rows import DATASETS, Column, Row

STATE_FILE = "_turnlog_export.json"
LOCK_FILE = ".turnlog_export.lock"
FORMAT = 1
"""Version of the state file and layout; an unknown one is refused."""
DAY_MS = 86_400_000
_FILE = re.compile(r"^p(\d+)-(\d+)-(\d+)\.parquet$")
_TYPES = {
    "str": pa.string(),
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "time": pa.timestamp("ms", tz="UTC"),
}


def arrow_schema(dataset: str, content: bool) -> pa.Schema:
    return pa.schema([_field(c) for c in DATASETS[dataset].columns_for(content)])


def _field(column: Column) -> pa.Field:
    metadata = {"doc": column.doc} if column.doc else None
    return pa.field(column.name, _TYPES[column.type], metadata=metadata)


@dataclass
class ExportState:
    """An export's committed position and what it is an export of."""

    source: str
    """The log it reads (``sqlite:<path>`` or ``kafka:<topic>``): another log's export is refused."""
    partitions: int
    content: bool
    next_offsets: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> str:
        offsets = {str(p): o for p, o in sorted(self.next_offsets.items())}
        return json.dumps(
            {"format": FORMAT, "source": self.source, "partitions": self.partitions,
             "content": self.content, "next_offsets": offsets},
            indent=2,
        )  # fmt: skip


def check_directory(out: Path) -> None:
    """Refuse an output directory that is missing, not a directory, or not writable."""
    if not out.exists():
        raise ExportError(f"the output directory {out} does not exist; create it first (mkdir -p {out})")
    if not out.is_dir():
        raise ExportError(f"{out} is not a directory; name a directory for the export's files")
    if not os.access(out, os.W_OK | os.X_OK):
        raise ExportError(
            f"the output directory {out} is not writable by this user; give it write permission "
            "or name another directory"
        )


def lock(out: Path) -> IO[str]:
    """Hold the directory's lock until the returned file is closed: one export writes at a time."""
    try:
        handle = open(out / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 - held open on purpose
    except OSError as exc:
        raise ExportError(f"cannot write in the output directory {out}: {exc.strerror}") from exc
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ExportError(
            f"another turnlog export is writing to {out}; stop it first (or export to another directory)"
        ) from None
    return handle


def load_state(out: Path) -> ExportState | None:
    """The committed position in ``out``, or None for a directory no export has committed to."""
    path = out / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ExportError(
            f"{path} cannot be read ({exc}); it is the export's committed position: restore it, "
            "or export into an empty directory"
        ) from exc
    if data.get("format") != FORMAT:
        raise ExportError(
            f"{path} has format {data.get('format')!r}; this turnlog writes format {FORMAT} "
            "(export into an empty directory, or use the turnlog version that wrote it)"
        )
    offsets = {int(p): int(o) for p, o in data["next_offsets"].items()}
    return ExportState(data["source"], int(data["partitions"]), bool(data["content"]), offsets)


def save_state(out: Path, state: ExportState) -> None:
    """Replace the committed position atomically and durably."""
    tmp = out / f".{STATE_FILE}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(state.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out / STATE_FILE)
    _fsync_dir(out)


def remove_leftovers(out: Path, committed: dict[int, int]) -> int:
    """Delete data files a killed export wrote beyond the committed position (and its
    temporary files); return how many. Their offsets are exported again."""
    removed = 0
    for path in out.glob("*/day=*/*"):
        match = _FILE.match(path.name)
        if path.name.endswith(".tmp") or (match and int(match[2]) >= committed.get(int(match[1]), 0)):
            path.unlink()
            removed += 1
    return removed


def day_of(time_ms: int) -> str:
    return dt.datetime.fromtimestamp(time_ms // DAY_MS * 86_400, dt.UTC).date().isoformat()


class ParquetSink:
    """Writes one flush of one partition: a Parquet file per dataset and day, durably."""

    def __init__(self, out: Path, content: bool, compression: str = "zstd") -> None:
        self.out = out
        self.content = content
        self.compression = compression
        self.schemas = {name: arrow_schema(name, content) for name in DATASETS}

    def write(self, partition: int, first: int, end: int, rows: Sequence[tuple[str, Row]]) -> list[Path]:
        """Write ``rows`` (of offsets ``first`` up to ``end``) and make them durable; return the files."""
        groups: dict[tuple[str, int], list[Row]] = {}
        for name, row in rows:
            groups.setdefault((name, row[2] // DAY_MS), []).append(row)
        written, folders = [], set()
        for (name, day), group in sorted(groups.items()):
            folder = self.out / name / f"day={day_of(day * DAY_MS)}"
            if not folder.exists():
                folder.mkdir(parents=True, exist_ok=True)
                folders.update({folder.parent, self.out})
            path = folder / f"p{partition}-{first:012d}-{end:012d}.parquet"
            self._write_file(path, self._table(name, group))
            written.append(path)
            folders.add(folder)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            _fsync_dir(folder)
        return written

    def _table(self, name: str, rows: list[Row]) -> pa.Table:
        schema = self.schemas[name]
        columns = list(zip(*rows, strict=True))
        arrays = [pa.array(values, type=f.type) for values, f in zip(columns, schema, strict=True)]
        return pa.Table.from_arrays(arrays, schema=schema)

    def _write_file(self, path: Path, table: pa.Table) -> None:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression=self.compression)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
