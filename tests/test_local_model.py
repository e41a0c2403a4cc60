"""The embedded default model for real: Qwen2.5-Coder-1.5B-Instruct (GGUF, from its packages) on
llama.cpp's OpenAI-compatible server, driven through the same adapter as any remote model.

Slow (minutes on two CPU cores) but CI runs it: it is the test that the engine makes a small real
model useful. Outside CI it is skipped when the `local` extra is not installed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import AgentSessions, SqliteEventLog
from engine import events as ev
from engine.agent import AgentDirectory
from engine.models.prompt_tools import PromptToolsModel
from engine.stream import ModelDelta
from examples.logistics import AGENT_ID, TASK, LogisticsBackend, build_agent
from examples.logistics.backend import last_week
from turnlog.local_model import MODEL_SHA256, LocalModelServer, local_model_installed, serve_local_model

pytestmark = pytest.mark.skipif(
    not local_model_installed() and not os.environ.get("CI"),
    reason="the local model is not installed (pip install -e '.[local]'); CI always runs this",
)
REPAIRS = Path(__file__).parent / "corpus" / "local_model_repairs.json"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalModelServer]:
    with serve_local_model(tmp_path_factory.mktemp("local-model")) as running:
        yield running


def test_model_file_is_assembled_and_verified(server: LocalModelServer) -> None:
    assert server.model_path.stat().st_size == 1_117_320_768
    assert server.model_path.with_suffix(".sha256").read_text().strip() == MODEL_SHA256


async def test_the_demo_scenario_completes_on_the_local_model(
    server: LocalModelServer, tmp_path: Path
) -> None:
    model = server.model()
    assert isinstance(model, PromptToolsModel)
    backend = LogisticsBackend(today=dt.date.today(), reports_dir=tmp_path / "reports")
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    api = AgentSessions(log, AgentDirectory([build_agent(model, backend)]))
    session = await api.create_session(AGENT_ID, "demo-user")
    items = [item async for item in api.send_user_message(session.session_id, TASK)]
    await log.close()
    _keep_repairs(model)

    events = [i for i in items if isinstance(i, ev.Event)]
    finished = {e.call_id: e for e in events if isinstance(e, ev.ToolCallFinished)}
    requested = [e for e in events if isinstance(e, ev.ToolCallRequested)]
    ran = [(r, finished[r.call_id]) for r in requested if r.call_id in finished]

    monday, sunday = last_week(backend.today)
    queries = [
        json.loads(r.arguments_json)
        for r, f in ran
        if r.tool_name == "query_orders" and f.status == "success"
    ]
    assert any(
        q.get("start_date") == monday.isoformat() and q.get("end_date") == sunday.isoformat() for q in queries
    )
    anomalous = {o["order_id"]: o["customer_id"] for o in backend.find_orders(monday, sunday, True)}
    notified = [json.loads(r.arguments_json) for r, f in ran if r.tool_name == "send_notification"]
    assert notified and all(anomalous.get(n["order_id"]) == n["customer_id"] for n in notified)
    assert len(backend.outbox) == len(
        {n["order_id"] for n in notified if anomalous[n["order_id"]] != "C-105"}
    )
    assert any(r.tool_name == "save_report" and f.status == "success" for r, f in ran)
    assert list((tmp_path / "reports").glob("*.md"))

    [turn] = [e for e in events if isinstance(e, ev.TurnFinished)]
    # answered, or (a small model that keeps calling tools) stopped by a loop guard and then made to answer
    assert turn.reason in ("answered", "iteration_cap", "repeated_call", "unchanged_result")
    answer = [e for e in events if isinstance(e, ev.AssistantMessage)][-1]
    assert answer.text.strip() and not answer.tool_calls and '"arguments"' not in answer.text
    streamed = "".join(i.text for i in items if isinstance(i, ModelDelta))
    assert '"arguments"' not in streamed and "```json" not in streamed  # no tool-call JSON reached the user


def _keep_repairs(model: PromptToolsModel) -> None:
    """Add the answers that needed repair to the parser's corpus of real shapes."""
    known = json.loads(REPAIRS.read_text()) if REPAIRS.exists() else []
    new = [text for text in model.repaired_texts if text not in known]
    if new:
        REPAIRS.write_text(json.dumps(known + new, ensure_ascii=False, indent=1) + "\n")
