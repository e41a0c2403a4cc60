"""What a runner keeps of sessions between turns is bounded by memory, not by count: whole
sessions are evicted least recently used first, the session in use never, and a session evicted
is read back from the log with nothing lost (the model is sent its whole history)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway_support import build_gateway
from turnlog.config import cache_bytes_from_env, kafka_index_bytes_from_env
from turnlog.engine import Agent, AgentDirectory, AgentSessions, FunctionModel, ModelRequest, SqliteEventLog
from turnlog.engine.errors import ConfigurationError
from turnlog.engine.log.kafka_held import DEFAULT_INDEX_BYTES
from turnlog.engine.session_cache import (
    DEFAULT_CACHE_BYTES,
    MESSAGE_BYTES,
    STATE_BYTES,
    Kind,
    SessionCache,
    history_bytes,
)
from turnlog.engine.turn import STATE

REPO = Path(__file__).resolve().parent.parent

A: Kind[str] = Kind("a")
B: Kind[str] = Kind("b")


def test_sessions_are_evicted_whole_least_recently_used_first() -> None:
    cache = SessionCache(budget_bytes=1000)
    cache.put("s1", A, "s1-a", 300)
    cache.put("s1", B, "s1-b", 100)
    cache.put("s2", A, "s2-a", 400)
    assert (cache.bytes, len(cache)) == (800, 2)
    assert cache.get("s1", A) == "s1-a"  # s1 is now the most recently used
    cache.put("s3", A, "s3-a", 300)  # 1100 > 1000: s2 goes, not s1
    assert (cache.get("s2", A), cache.get("s1", B), cache.get("s3", A)) == (None, "s1-b", "s3-a")
    assert (cache.bytes, cache.evicted) == (700, 1)
    cache.put("s3", A, "s3-a2", 900)  # re-weighed in place; s1 (both of its values) goes
    assert (cache.get("s1", A), cache.get("s1", B), cache.bytes) == (None, None, 900)
    cache.put("s3", B, "s3-b", 500)  # the session in use alone over the budget: it stays
    assert (len(cache), cache.bytes, cache.get("s3", B)) == (1, 1400, "s3-b")
    cache.discard("s3", A)
    assert (cache.bytes, cache.get("s3", A)) == (500, None)
    cache.discard("s3")
    assert (len(cache), cache.bytes) == (0, 0)


def test_a_history_is_weighed_by_its_text_and_its_messages() -> None:
    from turnlog.engine.messages import ChatMessage

    messages = [ChatMessage.user("x" * 1000), ChatMessage("assistant", "y" * 10)]
    assert history_bytes(messages) == 2 * MESSAGE_BYTES + 1010
    assert history_bytes(messages, 1) == MESSAGE_BYTES + 10


async def test_a_worker_keeps_what_its_budget_allows_and_reads_evicted_sessions_back(tmp_path: Path) -> None:
    def answer(request: ModelRequest) -> str:
        users = [m.content for m in request.messages if m.role == "user"]
        return f"seen {len(users)}: " + "z" * 2000

    model = FunctionModel(answer, name="m")
    log = SqliteEventLog(tmp_path / "log.db", partitions=2)
    budget = 150_000  # a few sessions of a few long messages each (about 25 KB a session)
    api = AgentSessions(log, AgentDirectory([Agent.build("a", model)]), cache_bytes=budget)
    sids = [(await api.create_session("a", "u")).session_id for _ in range(12)]
    for round_ in range(3):
        for sid in sids:
            async for _ in api.send_user_message(sid, f"message {round_} " + "q" * 1000):
                pass
    cache = api.runner.cache
    assert cache.bytes <= budget
    assert 1 < len(cache) < len(sids)
    assert cache.evicted > 0
    # the evicted sessions' turns were right: the model saw every message of each session
    last_round = model.requests[-len(sids) :]
    assert [sum(1 for m in r.messages if m.role == "user") for r in last_round] == [3] * len(sids)
    kept = [sid for sid in sids if cache.get(sid, STATE) is not None]
    state = cache.get(kept[-1], STATE)
    assert state is not None and len(state.messages) >= 6
    assert cache.bytes >= len(kept) * (STATE_BYTES + history_bytes(state.messages)) // 2
    await log.close()


def test_the_cache_budget_is_a_deployment_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNLOG_CACHE_MB", raising=False)
    assert cache_bytes_from_env(None, DEFAULT_CACHE_BYTES) == DEFAULT_CACHE_BYTES
    monkeypatch.setenv("TURNLOG_CACHE_MB", "64")
    assert cache_bytes_from_env(None, DEFAULT_CACHE_BYTES) == 64 << 20
    assert cache_bytes_from_env(8, DEFAULT_CACHE_BYTES) == 8 << 20  # the option wins
    monkeypatch.setenv("TURNLOG_CACHE_MB", "0")
    with pytest.raises(ConfigurationError, match="at least 1 MB, not 0 .--cache-mb or TURNLOG_CACHE_MB"):
        cache_bytes_from_env(None, DEFAULT_CACHE_BYTES)

    # a Kafka process's hold on the log's records is sized the same way, by its variable only
    monkeypatch.setenv("TURNLOG_KAFKA_INDEX_MB", "32")
    assert kafka_index_bytes_from_env(DEFAULT_INDEX_BYTES) == 32 << 20
    monkeypatch.setenv("TURNLOG_KAFKA_INDEX_MB", "0")
    with pytest.raises(ConfigurationError, match=r"at least 1 MB, not 0 \(TURNLOG_KAFKA_INDEX_MB\)"):
        kafka_index_bytes_from_env(DEFAULT_INDEX_BYTES)
    monkeypatch.delenv("TURNLOG_KAFKA_INDEX_MB")
    assert kafka_index_bytes_from_env(DEFAULT_INDEX_BYTES) == DEFAULT_INDEX_BYTES

    # a gateway's two runners (its API's and its worker's) each keep at most that
    gw, *_ = build_gateway(tmp_path, cache_bytes=8 << 20)
    assert gw.worker is not None
    assert gw.api.runner.cache.budget_bytes == gw.worker.runner.cache.budget_bytes == 8 << 20

    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "TURNLOG_CACHE_MB": "lots"}
    run = subprocess.run(
        [sys.executable, "-m", "turnlog", "worker", "--home", str(tmp_path / "w")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "TURNLOG_CACHE_MB='lots' is not a whole number" in run.stdout + run.stderr
