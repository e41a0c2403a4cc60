#!/usr/bin/env python
"""turnlog against the best peer, column by column, from one run_peers.py results file.

    python bench/peers/compare.py [bench/results/peers/latest.json]

Prints a markdown table: for each persistence mode and column, turnlog's value, the best peer's
value (which peer), and the factor by which turnlog is better (> 1) or worse (< 1). Lower is
better for times, sizes and growth; higher is better for steps/s. The aim is a factor >= 10 on
the per-step overhead columns and no growth of per-turn cost with session length.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent / "results" / "peers" / "latest.json"
# (label, scenario, key, higher_is_better, format)
COLUMNS = (
    ("S1 wall us/step", "S1", "us_per_model_step", False, ".0f"),
    ("S1 cpu us/step", "S1", "cpu_us_per_model_step", False, ".0f"),
    ("S2 steps/s", "S2", "steps_per_s", True, ".0f"),
    ("S3 t1-10 ms", "S3", "turns_1_10_ms", False, ".2f"),
    ("S3 t91-100 ms", "S3", "turns_91_100_ms", False, ".2f"),
    ("S3 growth", "S3", "growth_ratio", False, ".2f"),
    ("S3 db KB", "S3", "db_bytes", False, ".0f"),
)
OURS = "turnlog"


def compare(doc: dict) -> list[dict]:
    rows = {(r["framework"], r["scenario"], r["persistence"]): r for r in doc["summary_medians"]}
    peers = sorted({f for f, _, _ in rows if f != OURS})
    out = []
    for pe in ("sqlite", "sqlite_normal", "memory"):
        for label, sc, key, higher, fmt in COLUMNS:
            ours = rows.get((OURS, sc, pe), {}).get(key)
            vals = {p: rows.get((p, sc, pe), {}).get(key) for p in peers}
            vals = {p: v for p, v in vals.items() if v is not None}
            if ours is None or not vals:
                continue
            best = (max if higher else min)(vals, key=vals.__getitem__)
            scale = 1 / 1024 if key == "db_bytes" else 1
            factor = (ours / vals[best]) if higher else (vals[best] / ours if ours > 0 else float("inf"))
            out.append(
                {
                    "persistence": pe,
                    "column": label,
                    "turnlog": format(ours * scale, fmt),
                    "best_peer": f"{format(vals[best] * scale, fmt)} ({best})",
                    "factor": factor,
                }
            )
    return out


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    doc = json.loads(path.read_text())
    eng = doc.get("turnlog_engine", {}).get("sha256_12", "?")
    print(f"<!-- from {path.name}, engine {eng}, {doc.get('created')} -->")
    print("| persist | column | turnlog | best peer | turnlog vs best peer |")
    print("|---|---|---|---|---|")
    for r in compare(doc):
        f = r["factor"]
        verdict = f"{f:.1f}x better" if f >= 1 else f"{1 / f:.1f}x worse"
        print(f"| {r['persistence']} | {r['column']} | {r['turnlog']} | {r['best_peer']} | {verdict} |")


if __name__ == "__main__":
    main()
