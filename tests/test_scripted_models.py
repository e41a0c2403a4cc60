"""The shipped test models: ``call()`` ids that every process agrees on, and a FunctionModel that
keeps only its latest requests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from turnlog.engine import FunctionModel, ModelRequest, call
from turnlog.engine.messages import ChatMessage

REPO = Path(__file__).resolve().parent.parent
PRINT_ID = "from engine import call; print(call('lookup', {'order_id': 'A-17'}).call_id)"


def test_a_call_id_is_the_same_in_every_process() -> None:
    """A successor worker re-asks a FunctionModel after a crash; its call ids must match the ones
    on the log, whatever hash seed its interpreter drew."""
    ids = {
        subprocess.run(
            [sys.executable, "-c", PRINT_ID],
            capture_output=True, text=True, check=True, cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)},
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }  # fmt: skip
    assert ids == {call("lookup", {"order_id": "A-17"}).call_id}
    assert call("lookup", {"order_id": "A-18"}).call_id not in ids
    assert call("lookup", {"order_id": "A-17"}, "mine").call_id == "mine"


async def test_a_function_model_keeps_its_latest_requests_only() -> None:
    model = FunctionModel(lambda request: "ok", keep_requests=10)
    for i in range(100):
        request = ModelRequest(messages=[ChatMessage.user(f"question {i}")])
        chunks = [chunk async for chunk in model.stream(request)]
        assert chunks[-1].text == "ok"  # type: ignore[union-attr]
    assert model.calls == 100
    assert 10 <= len(model.requests) <= 20
    assert model.requests[-1].messages[0].content == "question 99"
