"""The long-running programs' garbage collector (turnlog.collector): start-up objects frozen, the
young generation collected every ``YOUNG`` allocations, TURNLOG_GC_YOUNG to change or undo it,
and cycles still collected. Each check runs in a process of its own: a frozen or retuned
collector would change the test process for every test after it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import REPO, program_env, turnlog
from turnlog.collector import YOUNG

PROBE = """
import gc, json, weakref
from turnlog.collector import tune_collector

before = gc.get_threshold()
tune_collector()
frozen, threshold = gc.get_freeze_count(), gc.get_threshold()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: reference counts alone never free it
gone = weakref.ref(a)
del a, b
churn = [[] for _ in range(3 * max(threshold[0], 700))]  # allocations enough for young collections
print(json.dumps({"before": before, "threshold": threshold, "frozen": frozen, "cycle_freed": gone() is None}))
"""


def probe(**env: str) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=program_env(**env),
    )
    assert run.returncode == 0, run.stderr
    found: dict[str, Any] = json.loads(run.stdout)
    return found


def test_a_service_freezes_what_start_up_made_and_collects_young_objects_less_often() -> None:
    found = probe()
    assert found["threshold"] == [YOUNG, *found["before"][1:]]
    assert found["frozen"] > 1000  # the modules imported by then, out of every later collection
    assert found["cycle_freed"]  # garbage in cycles is still collected, later


def test_the_young_threshold_is_a_deployment_setting() -> None:
    found = probe(TURNLOG_GC_YOUNG="2000")
    assert found["threshold"][0] == 2000 and found["frozen"] > 0 and found["cycle_freed"]
    untouched = probe(TURNLOG_GC_YOUNG="0")  # Python's collector as it was
    assert untouched["threshold"] == untouched["before"] and untouched["frozen"] == 0


@pytest.mark.parametrize("program", ["serve", "worker"])
def test_a_bad_setting_stops_the_program_with_what_to_do(tmp_path: Path, program: str) -> None:
    made = turnlog(tmp_path, "add-key", "alice")
    assert made.returncode == 0, made.stderr  # serve reads its key file before it starts
    run = turnlog(tmp_path, program, TURNLOG_GC_YOUNG="-5")
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert "TURNLOG_GC_YOUNG=-5 must be 0" in out and "Traceback" not in out
