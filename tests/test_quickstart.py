"""docs/quickstart.md works as written: in a fresh folder, the agent file saved from the page,
`turnlog demo --agents ...` running its turn, then `turnlog serve` with a key and the page's
curl commands answering the message over HTTP. Only the port differs (8080 may be taken here)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests import doc_blocks
from tests.openai_server import free_port

PAGE = doc_blocks.ROOT / "docs" / "quickstart.md"
MINE = "tests/test_quickstart.py"


def quickstart_blocks() -> list[doc_blocks.Block]:
    """The page's blocks this test runs (the rest run in tests/test_doc_examples.py)."""
    return [b for b in doc_blocks.blocks(PAGE) if b.test == MINE]


def test_the_quickstart_from_a_fresh_folder(tmp_path: Path) -> None:
    port = str(free_port())
    blocks = [_on_port(b, port) for b in quickstart_blocks()]
    files = [b for b in blocks if "title" in b.settings]
    commands = [b for b in blocks if b.lang == "bash"]
    assert [b.settings["title"] for b in files] == ["my_agent.py"] and len(commands) == 3
    for block in files:
        doc_blocks.save(block, tmp_path)

    demo = doc_blocks.run_bash(commands[0], tmp_path)
    assert "weather" in demo and "finished: answered" in demo, demo

    with (tmp_path / "serve.err").open("w") as errors:
        server = subprocess.Popen(
            ["bash", "-e", "-c", commands[1].source], cwd=tmp_path, env=doc_blocks.env(tmp_path),
            stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_ready(server, port, tmp_path)
        answer = doc_blocks.run_bash(commands[2], tmp_path, timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    lines = answer.splitlines()
    assert json.loads(lines[0])["version"] == 2, answer  # the post: 202 with the message's place on the log
    events = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert events[0] == "SessionCreated" and events[-1] == "TurnFinished", answer
    assert "ToolCallFinished" in events and events.count("ModelCallFinished") == 2, events
    expected = 'Here is the weather: {"city":"Paris","sky":"sunny","celsius":21}'
    assert lines[-1] == expected, answer
    assert expected in PAGE.read_text(encoding="utf-8")  # the page shows what the reader gets


def _on_port(block: doc_blocks.Block, port: str) -> doc_blocks.Block:
    return doc_blocks.Block(
        block.path, block.line, block.lang, block.settings, block.source.replace("8080", port)
    )


def _wait_ready(server: subprocess.Popen[bytes], port: str, folder: Path) -> None:
    """Until the gateway answers /readyz 200 (the key file is written before it starts)."""
    deadline = time.monotonic() + 120
    while True:
        assert server.poll() is None, (folder / "serve.err").read_text()
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return
        assert time.monotonic() < deadline, "turnlog serve was not ready in 120 s"
        time.sleep(0.2)
