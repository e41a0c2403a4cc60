"""Results the model can use (seed §4.2, §7.1, §7.2): short readable text, cut with a note.

The model reads ``ToolCallFinished.content``; the full structured result stays in
``output_json`` on the log and in the tool_calls projection, so cutting the text loses nothing.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

TRUNCATION_NOTE = (
    "\n[TRUNCATED: showing the first {kept} of {total} characters; {cut} characters were cut. "
    "The full result is stored; ask for a narrower query if you need the rest.]"
)


def truncate(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and a note of what was cut."""
    if len(text) <= limit:
        return text
    # the note itself counts against the limit, so the model's budget holds
    kept = max(0, limit - len(TRUNCATION_NOTE.format(kept=limit, total=len(text), cut=len(text))))
    return text[:kept] + TRUNCATION_NOTE.format(kept=kept, total=len(text), cut=len(text) - kept)


def list_summary(
    fields: Sequence[str], *, label: str = "items", show: int = 10, count_by: str | None = None
) -> Callable[[Any], str]:
    """A formatter for results that are lists of records: "12 orders; by carrier: A 3, B 9.
    First 10: ..." with only ``fields`` of each record. Anything else falls back to compact JSON."""

    def format_result(result: Any) -> str:
        rows = result if isinstance(result, list) else None
        if rows is None or not all(isinstance(r, dict) for r in rows):
            return json.dumps(result, ensure_ascii=False, separators=(",", ":"), default=str)
        head = f"{len(rows)} {label}"
        if count_by is not None and rows:
            counts: dict[str, int] = {}
            for r in rows:
                key = str(r.get(count_by, "?"))
                counts[key] = counts.get(key, 0) + 1
            head += f"; by {count_by}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        lines = [", ".join(f"{f}={r.get(f)}" for f in fields if f in r) for r in rows[:show]]
        more = f"\n(and {len(rows) - show} more)" if len(rows) > show else ""
        shown = f". First {min(show, len(rows))}:\n" if rows else "."
        return head + shown + "\n".join(f"- {line}" for line in lines) + more

    return format_result
