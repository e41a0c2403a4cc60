"""Every code block of the docs and the README that is meant to run, runs (tests/doc_blocks.py
says how a block is marked): each page's blocks in order, in a fresh folder; and every block is
accounted for: run here, run by the test it names, shown as data, or not run with a reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pytest_examples import EvalExample

from tests import doc_blocks
from tests.doc_blocks import DATA, ELSEWHERE, ROOT, RUNNABLE, Block, PythonSession

PAGES = doc_blocks.pages()
RUN_PAGES = [p for p in PAGES if any(b.runs_here or "title" in b.settings for b in doc_blocks.blocks(p))]


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_block_is_accounted_for() -> None:
    problems = []
    for page in PAGES:
        for block in doc_blocks.blocks(page):
            problems += _problems(block)
    assert not problems, "\n".join(problems)


def _problems(block: Block) -> list[str]:
    known = RUNNABLE | ELSEWHERE | DATA
    if block.lang not in known:
        return [f"{block.where}: say what the block is: one of {', '.join(sorted(known))} after the ```"]
    test = block.test
    if test == "skip":
        if not block.settings.get("reason", "").strip():
            return [f'{block.where}: test="skip" needs reason="why it cannot run here"']
        return []
    if test:
        if not (test.startswith("tests/") and (ROOT / test).is_file()):
            return [f'{block.where}: test="{test}" names no test file; use test="tests/test_x.py" or "skip"']
        if block.path.name not in (ROOT / test).read_text(encoding="utf-8"):
            return [f"{block.where}: {test} does not read {block.path.name}, so it cannot run this block"]
        return []
    if block.lang in ELSEWHERE:
        return [f'{block.where}: a {block.lang} block names the test that runs it: test="tests/test_x.py"']
    return []


@pytest.mark.parametrize("page", RUN_PAGES, ids=_id)
def test_page_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's runnable blocks, in order, as a reader would type them into one folder."""
    for name in doc_blocks.UNSET_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    session = PythonSession(tmp_path)
    ran, printed = 0, None
    try:
        for block in doc_blocks.blocks(page):
            if block.settings.get("output") == "above":
                assert printed == block.source, f"{block.where}: the block above printed\n{printed}"
            printed = None
            if "title" in block.settings and not block.test:
                doc_blocks.save(block, tmp_path)
            elif block.runs_here and block.lang == "python":
                printed = session.run(block)
                ran += 1
            elif block.runs_here and block.lang == "bash":
                doc_blocks.run_bash(block, tmp_path)
                ran += 1
    finally:
        session.close()
        for name in [m for m in sys.modules if _saved_here(sys.modules[m], tmp_path)]:
            del sys.modules[name]  # a page's own modules (my_agent.py) do not leak into the next
    assert ran or any("title" in b.settings for b in doc_blocks.blocks(page))


def _saved_here(module: object, folder: Path) -> bool:
    path = getattr(module, "__file__", None)
    return bool(path) and Path(str(path)).is_relative_to(folder)


PYTHON_BLOCKS = [b for p in PAGES for b in doc_blocks.blocks(p) if b.lang == "python"]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.where)
def test_python_blocks_pass_ruff(block: Block, eval_example: EvalExample) -> None:
    """Lint each Python block (undefined names allowed: a page's blocks share one namespace)."""
    eval_example.set_config(ruff_ignore=["F704", "F821", "PLE1142"], ruff_select=["E", "F", "W", "I", "B"])
    eval_example.lint_ruff(block.example())
