"""What a Kafka log process holds in memory as its partitions' history grows (engine/log/kafka_held.py).

One owner of a fresh topic appends sessions at rest (created, then a message and its drop, twelve
times: 25 records of about 1 kB each once indexed), 500 at a time, and reports after each round
its resident memory and what its partition indexes hold by estimate, once with ``--budget-mb``
and once without a bound (every record kept, as before the bound)::

    scripts/kafka.sh start
    PYTHONPATH=. .venv/bin/python bench/kafka_index_memory.py [--rounds 16] [--budget-mb 16] \
        [--out bench/results/kafka-index-memory.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.services import kafka_log
from turnlog.engine import events as ev
from turnlog.engine.admission import AdmissionRules
from turnlog.engine.log.kafka import KafkaEventLog

ROUND = 500
PARTITIONS = 4
TEXT = "x" * 300
UNBOUNDED_BYTES = 1 << 40


def rss_mb() -> float:
    pages = int(Path(f"/proc/{os.getpid()}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def session_at_rest(sid: str) -> list[ev.Event]:
    events: list[ev.Event] = [ev.SessionCreated(session_id=sid, version=1, agent_id="a", user_id="u")]
    for k in range(12):
        mid = ev.new_id()
        events.append(ev.UserMessageReceived(session_id=sid, version=2 + 2 * k, message_id=mid, text=TEXT))
        events.append(
            ev.UserMessageDropped(session_id=sid, version=3 + 2 * k, message_id=mid, reason="cancelled")
        )
    return events


def held(log: KafkaEventLog) -> dict[str, Any]:
    indexes = [owner.index for owner in log._owners]
    return {
        "held_mb_estimate": round(sum(i.held_bytes for i in indexes) / 2**20, 1),
        "sessions_unloaded": sum(len(i.unloaded) for i in indexes),
        "window_records": sum(len(i.records) for i in indexes),
    }


async def run(bootstrap: str, rounds: int, budget_bytes: int) -> list[dict[str, Any]]:
    rows = []
    async with kafka_log(
        bootstrap, partitions=PARTITIONS, admission=AdmissionRules(), index_bytes=budget_bytes
    ) as log:
        start = rss_mb()
        for r in range(rounds):
            sids = [f"r{r}-{i}-{ev.new_id()[:8]}" for i in range(ROUND)]
            await asyncio.gather(*(log.append(session_at_rest(sid), expected_version=0) for sid in sids))
            gc.collect()
            sessions = (r + 1) * ROUND
            row = {"sessions": sessions, "records": sessions * 25, "rss_mb": round(rss_mb(), 1), **held(log)}
            row["rss_growth_kb_per_record"] = round((row["rss_mb"] - start) * 1024 / row["records"], 2)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--budget-mb", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a case's budget, bytes
    args = parser.parse_args()
    bootstrap = os.environ.get("TURNLOG_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    if args.one is not None:  # one case in a process of its own: freed memory stays in a process's RSS
        print(json.dumps(asyncio.run(run(bootstrap, args.rounds, args.one))))
        return
    results = {}
    for label, budget in (("unbounded", UNBOUNDED_BYTES), (f"{args.budget_mb} MB", args.budget_mb << 20)):
        print(f"-- {label}", file=sys.stderr)
        command = [sys.executable, __file__, "--rounds", str(args.rounds), "--one", str(budget)]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])  # after the log lines
    print("| sessions (25 records each) | " + " | ".join(f"RSS, {label} (MB)" for label in results) + " |")
    print("|---:|" + "---:|" * len(results))
    for i, row in enumerate(results["unbounded"]):
        if i % 3 == 1 or i == len(results["unbounded"]) - 1:
            cells = " | ".join(f"{rows[i]['rss_mb']}" for rows in results.values())
            print(f"| {row['sessions']:,} | {cells} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"partitions": PARTITIONS, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
