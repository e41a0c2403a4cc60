"""The code blocks of the docs (docs/**/*.md and README.md), found and run as a reader would.

A block's fence says what it is and whether it runs: the language first (```` ```python ````,
```` ```bash ````, ...), then settings in braces. ``{title="my_agent.py"}`` makes it a file the
reader saves (written into the page's folder, not run); ``{test="skip" reason="..."}`` says why
it cannot run here; ``{test="tests/test_x.py"}`` names the test that runs it instead; a
``text`` block with ``{output="above"}`` is what the Python block before it prints, exactly.
Every other ``python`` or
``bash`` block runs in tests/test_doc_examples.py: a page's blocks in order, in one fresh
folder, the Python ones in one namespace and one event loop (top-level ``await`` works, as in
``python -m asyncio``), the shell ones with this venv's ``turnlog`` on the PATH.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_examples import CodeExample

ROOT = Path(__file__).resolve().parent.parent
RUNNABLE = frozenset({"python", "bash"})
"""Languages a block is meant to run in: unmarked, it runs."""
ELSEWHERE = frozenset({"sql"})
"""Languages that run, but not here: a block must name its test (DuckDB queries: analytics)."""
DATA = frozenset({"text", "json", "toml", "yaml", "console"})
"""Languages of what is shown, not run (a diagram, an answer, a file's content)."""
_FENCE = re.compile(r"^( *)```(\w*)([^\n]*)\n(.*?)^\1```[ \t]*$", re.M | re.S)
_SETTING = re.compile(r"""([\w-]+)=(["'])(.*?)\2""")
UNSET_ENV = ("TURNLOG_BASE_URL", "OPENAI_BASE_URL", "TURNLOG_MODEL", "TURNLOG_AGENTS", "TURNLOG_KEYS")
UNSET_ENV += ("TURNLOG_HOME", "TURNLOG_CONFIG", "TURNLOG_API_KEY", "OPENAI_API_KEY")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    path: Path
    line: int
    """The fence's line, 1-based."""
    lang: str
    settings: dict[str, str] = field(hash=False)
    source: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def test(self) -> str:
        return self.settings.get("test", "")

    @property
    def runs_here(self) -> bool:
        """Run by tests/test_doc_examples.py: a runnable language, not skipped, not delegated."""
        return self.lang in RUNNABLE and not self.test

    def example(self) -> CodeExample:
        """The block as pytest-examples sees it (to lint it with ruff)."""
        return CodeExample.create(self.source, path=self.path, start_line=self.line, prefix=self.lang)


def pages() -> list[Path]:
    """Every Markdown page of the docs, and the README."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        indent, lang, rest, body = match.groups()
        source = "\n".join(line[len(indent) :] for line in body.splitlines()) + "\n"
        settings = {m.group(1): m.group(3) for m in _SETTING.finditer(rest)}
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(path, line, lang, settings, source))
    return found


def env(folder: Path) -> dict[str, str]:
    """A reader's shell: this venv's programs first, no model endpoint or agents configured."""
    shell = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    shell["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{shell.get('PATH', '')}"
    shell["PYTHONPATH"] = str(folder)
    shell["COLUMNS"] = "200"
    return shell


def save(block: Block, folder: Path) -> Path:
    """A block with a title is a file the reader saves under that name."""
    target = folder / block.settings["title"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.source, encoding="utf-8")
    return target


def run_bash(block: Block, folder: Path, timeout: float = 300) -> str:
    """Run a shell block in ``folder``; its output, or a failure naming the block."""
    done = subprocess.run(
        ["bash", "-e", "-c", block.source], cwd=folder, env=env(folder), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass
class PythonSession:
    """The Python blocks of one page: one namespace, one event loop, run in ``folder``."""

    folder: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__main__"})
    runner: asyncio.Runner = field(default_factory=asyncio.Runner)

    def run(self, block: Block) -> str:
        """Run the block; what it printed."""
        code = compile(block.source, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            result = eval(code, self.namespace)  # noqa: S307 (the docs' own code)
            if asyncio.iscoroutine(result):
                self.runner.run(result)
        return printed.getvalue()

    def close(self) -> None:
        self.runner.close()
