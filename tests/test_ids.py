"""Event, message and turn ids (``turnlog.engine.events.new_id``): 128 random bits as 32 hex characters,
read ahead from the OS in batches; never repeated, also not by a forked child, which would
otherwise hand out the ids its parent had read ahead."""

from __future__ import annotations

import os
import re

from turnlog.engine import events as ev


def test_ids_are_32_hex_characters_and_never_repeat() -> None:
    ids = [ev.new_id() for _ in range(5000)]  # many batches of read-ahead
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_never_hands_out_its_parents_ids() -> None:
    ev.new_id()  # the parent now holds ids read ahead
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(writing, " ".join(ev.new_id() for _ in range(300)).encode())
        finally:
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading) as pipe:
        from_child = set(pipe.read().split())
    os.waitpid(child, 0)
    from_parent = {ev.new_id() for _ in range(300)}
    assert len(from_child) == 300
    assert from_child.isdisjoint(from_parent)
