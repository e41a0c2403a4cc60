"""The garbage collector of a long-running program (serve, worker, projector, memory, ...).

Python collects its young generation every 700 allocations. A process with hundreds of turns in
flight allocates that in well under a millisecond, so every object a turn holds while it waits
on its model (its tasks, requests, messages, records) survives many young collections and is
promoted to the oldest generation, and the full collections those promotions set off each walk
every object alive: the modules, schemas and agents loaded at start, and every cached session.
``tune_collector`` freezes what is alive once the program has started (it is never garbage, so
no collection walks it again) and lets ``young`` allocations pass between young collections, so
most of a turn's objects are freed by their reference counts before any collection sees them.
Cycles are still collected, a little later. bench/README.md has what it saves.
"""

from __future__ import annotations

import gc

from .config import gc_young_from_env

YOUNG = 10_000
"""Allocations between young collections (Python's default is 700); TURNLOG_GC_YOUNG sets it,
0 leaves the collector as Python set it."""


def tune_collector(young: int | None = None) -> None:
    """Collect once, freeze the survivors out of later collections, and collect the young
    generation every ``young`` allocations (default: TURNLOG_GC_YOUNG, else ``YOUNG``). The
    older generations keep Python's ratios (a middle collection every 10 young ones, a full one
    every 10 middle ones, and only once the survivors since the last grew by a quarter)."""
    young = gc_young_from_env(YOUNG) if young is None else young
    if young == 0:
        return
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
